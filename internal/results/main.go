// Command results regenerates the simulator tables quoted in the README and
// in docs/results.md, routers.md, fairness.md, outputs.md, learn.md,
// lora.md, pools.md and disagg.md, so that no number there can drift from
// the code.
//
// Each table in those files sits in a fenced block right after a comment
// naming the llmlb-sim arguments that print it:
//
//	<!-- llmlb-sim -seeds 8 -scenario prefixes -->
//	```text
//	...the table, without its legend...
//	```
//
// Run from the repository root:
//
//	go run ./internal/results          # rewrite the blocks
//	go run ./internal/results -check   # exit 1 if a block differs (CI)
//	go run ./internal/results -match 'routers 4' docs/routers.md   # only some blocks
//
// $TRACES in the arguments stands for ../shared/traces, where the public
// traces are kept beside the repository; a block whose trace is missing is
// left as it is, with a note.
package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
)

// block matches a generated block: the comment with the arguments, then a
// fenced text block.
var block = regexp.MustCompile("(?s)<!-- llmlb-sim ([^>]*?) -->\n```text\n(.*?)```\n")

const traces = "../shared/traces"

// only, if not empty, limits the blocks run to those whose arguments
// contain it (-match).
var only string

func main() {
	check := flag.Bool("check", false, "report the blocks that differ instead of rewriting them; exit 1 if any does")
	flag.StringVar(&only, "match", "", "only the blocks whose llmlb-sim arguments contain this string")
	flag.Parse()
	files := flag.Args()
	if len(files) == 0 {
		files = []string{"README.md", "docs/results.md", "docs/routers.md", "docs/fairness.md", "docs/outputs.md", "docs/learn.md", "docs/lora.md", "docs/pools.md", "docs/disagg.md"}
	}
	if err := run(files, *check); err != nil {
		fmt.Fprintln(os.Stderr, "results:", err)
		os.Exit(1)
	}
}

func run(files []string, check bool) error {
	dir, err := os.MkdirTemp("", "llmlb-results")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	bin := filepath.Join(dir, "llmlb-sim")
	build := exec.Command("go", "build", "-o", bin, "./cmd/llmlb-sim")
	build.Stderr = os.Stderr
	if err := build.Run(); err != nil {
		return fmt.Errorf("building llmlb-sim: %w", err)
	}
	stale := 0
	for _, f := range files {
		n, err := regenerate(f, bin, check)
		if err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		stale += n
	}
	if check && stale > 0 {
		return fmt.Errorf("%d block(s) differ from what llmlb-sim prints: run go run ./internal/results", stale)
	}
	return nil
}

// regenerate runs every block of file and rewrites it, or with check only
// compares, and returns the number of blocks that differed.
func regenerate(file, bin string, check bool) (int, error) {
	src, err := os.ReadFile(file)
	if err != nil {
		return 0, err
	}
	stale := 0
	var firstErr error
	out := block.ReplaceAllFunc(src, func(m []byte) []byte {
		sub := block.FindSubmatch(m)
		args, old := string(sub[1]), string(sub[2])
		if !strings.Contains(args, only) {
			return m
		}
		got, err := simulate(bin, args)
		if errors.Is(err, os.ErrNotExist) {
			fmt.Fprintf(os.Stderr, "results: %s: skipping llmlb-sim %s: %v\n", file, args, err)
			return m
		}
		if err != nil {
			if firstErr == nil {
				firstErr = fmt.Errorf("llmlb-sim %s: %w", args, err)
			}
			return m
		}
		if got != old {
			stale++
			fmt.Fprintf(os.Stderr, "results: %s: llmlb-sim %s: %s\n", file, args, map[bool]string{true: "differs", false: "updated"}[check])
		}
		return []byte("<!-- llmlb-sim " + args + " -->\n```text\n" + got + "```\n")
	})
	if firstErr != nil {
		return stale, firstErr
	}
	if !check && !bytes.Equal(out, src) {
		if err := os.WriteFile(file, out, 0o644); err != nil {
			return stale, err
		}
	}
	return stale, nil
}

// simulate runs llmlb-sim with args and returns its table without the
// legend. A missing trace is an error wrapping os.ErrNotExist.
func simulate(bin, args string) (string, error) {
	fields := strings.Fields(strings.ReplaceAll(args, "$TRACES", traces))
	for i, f := range fields {
		if i > 0 && fields[i-1] == "-trace" {
			if _, err := os.Stat(f); err != nil {
				return "", err
			}
		}
	}
	cmd := exec.Command(bin, fields...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("%w: %s", err, lastLine(stderr.String()))
	}
	text := stdout.String()
	if i := strings.Index(text, "\nCompare "); i >= 0 {
		text = text[:i+1]
	}
	return strings.TrimRight(text, "\n") + "\n", nil
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexAny(s, "\r\n"); i >= 0 {
		return s[i+1:]
	}
	return s
}
