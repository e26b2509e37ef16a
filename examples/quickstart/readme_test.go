package main

import (
	"bytes"
	"os"
	"testing"
)

// The README's quick start is this program, byte for byte.
func TestREADMEQuickStart(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile("main.go")
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := bytes.Cut(readme, []byte("\n## Quick start\n"))
	if !ok {
		t.Fatal("README has no Quick start section")
	}
	_, block, ok := bytes.Cut(after, []byte("\n```go\n"))
	if !ok {
		t.Fatal("the Quick start section has no go block")
	}
	block, _, ok = bytes.Cut(block, []byte("\n```\n"))
	if !ok {
		t.Fatal("the Quick start's go block is not closed")
	}
	block = append(block, '\n')
	if !bytes.Equal(block, src) {
		t.Errorf("the README's quick start differs from examples/quickstart/main.go; copy main.go into the README's go block")
	}
}
