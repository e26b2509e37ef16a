package main

import (
	"go/parser"
	"go/token"
	"strconv"
	"strings"
	"testing"
)

// TestImportsNoInternalPackage checks that the example can be copied into
// another module: it must build from the module's public packages only.
func TestImportsNoInternalPackage(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "main.go", nil, parser.ImportsOnly)
	if err != nil {
		t.Fatal(err)
	}
	for _, imp := range f.Imports {
		path, err := strconv.Unquote(imp.Path.Value)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(path, "/internal/") || strings.HasSuffix(path, "/internal") {
			t.Errorf("main.go imports %s, which a program outside this module cannot import", path)
		}
	}
}

// TestRun runs the example end to end: the agent loop, the kill and the
// fan-out must complete without error.
func TestRun(t *testing.T) {
	if testing.Short() {
		t.Skip("starts 4 emulated engines")
	}
	if err := run(); err != nil {
		t.Fatal(err)
	}
}
