package main

import (
	"bytes"
	"context"
	"go/parser"
	"go/token"
	"io"
	"net/http"
	"regexp"
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

// TestRun runs the example end to end: the six turns of the agent loop and
// the ten children of the fan-out, after the kill, all stream their tokens,
// and nothing is left counted in the balancer or the admission.
func TestRun(t *testing.T) {
	if testing.Short() {
		t.Skip("starts 4 emulated engines")
	}
	var out bytes.Buffer
	if err := run(&out); err != nil {
		t.Fatalf("%v; printed:\n%s", err, out.String())
	}
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`(?m)^  turn 6: engine-\d +ttft \S+ +24 tokens`),
		regexp.MustCompile(`(?m)^killed engine-\d`),
		regexp.MustCompile(`(?m)^balancer idle after the run: true, sessions in flight: 0$`),
	} {
		if !want.MatchString(out.String()) {
			t.Errorf("printed:\n%s\nwant a line matching %s", out.String(), want)
		}
	}
	if n := len(regexp.MustCompile(`(?m)^  child \d: 16 tokens, ttft `).FindAllString(out.String(), -1)); n != 10 {
		t.Errorf("printed:\n%s\n%d children streamed their 16 tokens, want 10", out.String(), n)
	}
}

// roundTripFunc is an http.RoundTripper of a function.
type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// A replica's error answer ends up in call's error, but only its head: a
// huge body is neither read whole nor copied into the error.
func TestCallErrorBodyBounded(t *testing.T) {
	body := strings.Repeat("overloaded ", 1<<20)
	client := &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		return &http.Response{
			StatusCode: http.StatusServiceUnavailable,
			Header:     http.Header{"Content-Type": {"text/plain"}},
			Body:       io.NopCloser(strings.NewReader(body)),
			Request:    r,
		}, nil
	})}
	_, err := call(context.Background(), client, []message{{"user", "hi"}}, 4)
	if err == nil {
		t.Fatal("call succeeded on a 503")
	}
	if msg := err.Error(); len(msg) > 2*maxErrorBody || !strings.HasPrefix(msg, "status 503: overloaded overloaded") {
		t.Errorf("error of %d bytes starting %.60q; want the status and at most the body's first %d bytes", len(msg), msg, maxErrorBody)
	}
}
