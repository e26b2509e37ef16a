// The tests of the demos, which a copy of the gateway leaves out with them.

package main

import (
	"go/parser"
	"go/token"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/llmlb/llmlb/internal/e2e"
)

// gatewayFiles returns the names of the Go files a copy of the gateway
// takes: all but the demo files, tests included.
func gatewayFiles(t *testing.T) []string {
	t.Helper()
	all, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	files := slices.DeleteFunc(all, func(name string) bool { return strings.HasPrefix(name, "demo") })
	if !slices.Contains(files, "main.go") {
		t.Fatalf("the gateway's files %q do not include main.go", files)
	}
	return files
}

// TestGatewayImportsNoInternalPackage checks that the gateway can be
// copied into another module: its files other than the demos import no
// internal package.
func TestGatewayImportsNoInternalPackage(t *testing.T) {
	for _, name := range gatewayFiles(t) {
		f, err := parser.ParseFile(token.NewFileSet(), name, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range f.Imports {
			path, err := strconv.Unquote(imp.Path.Value)
			if err != nil {
				t.Fatal(err)
			}
			if strings.Contains(path, "/internal/") || strings.HasSuffix(path, "/internal") {
				t.Errorf("%s imports %s, which a program outside this module cannot import; only the demo files may", name, path)
			}
		}
	}
}

// TestGatewayBuildsWithoutDemos copies the gateway's files, without the
// demo files, into a module of its own that requires this one, and checks
// that the copy and its tests build (go vet), from the module cache alone.
func TestGatewayBuildsWithoutDemos(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the gateway in another module")
	}
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command:", err)
	}
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	sum, err := os.ReadFile(filepath.Join(root, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for _, name := range gatewayFiles(t) {
		src, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), src, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	mod := "module example.com/gateway\n\ngo 1.26.0\n\n" +
		"require github.com/llmlb/llmlb v0.0.0-00010101000000-000000000000\n\n" +
		"replace github.com/llmlb/llmlb => " + strconv.Quote(root) + "\n"
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte(mod), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "go.sum"), sum, 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(goTool, "vet", ".")
	cmd.Dir = dir
	// -mod=mod completes the copy's requirements from this module's; the
	// modules come from the cache, never from the network.
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOPROXY=off", "GOWORK=off", "GOTOOLCHAIN=local")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("go vet of the gateway without its demo files: %v\n%s", err, out)
	}
}

// The demos' command lines: each error is printed once, names the flag, and
// exits with status 2.
func TestDemoCommandLine(t *testing.T) {
	testCommandLines(t, []commandLine{
		{"demo rate 0", []string{"-demo", "-rate", "0"}, 2, "-rate must be a positive number of arrivals per second, not 0"},
		{"demo rate negative", []string{"-demo", "-rate", "-5"}, 2, "-rate must be a positive number of arrivals per second, not -5"},
		{"demo rate NaN", []string{"-demo", "-rate", "NaN"}, 2, "-rate must be a positive number"},
		{"demo requests 0", []string{"-demo", "-requests", "0"}, 2, "-requests must be positive, not 0"},
		{"demo attempts negative", []string{"-demo", "-attempts", "-1"}, 2, "-attempts must not be negative"},
		{"demo-fair fair negative", []string{"-demo-fair", "-fair", "-1"}, 2, "-fair must not be negative"},
		{"demo-spill unknown policy", []string{"-demo-spill", "-policy", "leastload"}, 2, `-policy: unknown policy "leastload"`},
		{"no backends, demos named", nil, 2, "-backends is required (or use -demo, -demo-fair or -demo-spill)"},
	})
}

// TestDemoOutput runs -demo as a command with a short load: it prints a row
// per policy with every request complete on stdout, and nothing on stderr,
// where only its gateways' errors go.
func TestDemoOutput(t *testing.T) {
	p := startProcess(t, "-demo", "-requests", "4", "-rate", "400")
	var logged []string
	for p.lines.Scan() {
		logged = append(logged, p.lines.Text())
	}
	if ws := p.wait(); ws.Signaled() || ws.ExitStatus() != 0 {
		t.Errorf("exit %v, want 0", p.cmd.ProcessState)
	}
	if len(logged) > 0 {
		t.Errorf("stderr:\n%s\nwant nothing", strings.Join(logged, "\n"))
	}
	out := p.stdout.String()
	for _, policy := range []string{"default", "least-outstanding", "round-robin"} {
		if !regexp.MustCompile(`(?m)^ *` + policy + ` +4/4 `).MatchString(out) {
			t.Errorf("stdout has no row of %s with 4/4 requests complete:\n%s", policy, out)
		}
	}
}

// TestDemoFair runs a short -demo-fair over loopback: with the fair queue,
// the light tenant's requests all complete and their median time to first
// token is a clear factor below what it is without the queue, where they
// wait behind the heavy tenant's backlog in the engines. The factor measured
// is 6 to 8; the test asks for 3, so that a busy machine does not fail it.
func TestDemoFair(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the emulated engines in real time for several seconds")
	}
	load := fairDemoLoad // the demo's, with fewer light requests
	load.Light, load.Seed = 8, 1
	if raceEnabled {
		load.Light = 6 // the race detector slows the gateway and the clients
	}
	o := options{
		policy: "default",
		scrape: 100 * time.Millisecond,
		slots:  fairDemoEngine.MaxRunning,
		log:    slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	slots := fairDemoEngines * fairDemoEngine.MaxRunning
	run := func(fair int) fairResult {
		t.Helper()
		o.fairInFlight = fair
		res, err := fairRun(o, load)
		if err != nil {
			t.Fatalf("fair=%d: %v", fair, err)
		}
		t.Logf("fair=%d (%v): heavy %d complete, TTFT p50 %v; light %d/%d complete, TTFT p50 %v p99 %v; light token share %.1f%%",
			fair, res.Elapsed.Round(time.Millisecond), res.Heavy.Count((*e2e.Outcome).Complete), res.Heavy.TTFT(0.5),
			res.Light.Count((*e2e.Outcome).Complete), load.Light, res.Light.TTFT(0.5), res.Light.TTFT(0.99), 100*res.lightShare())
		// A light request the run's timeout cut is not among the
		// outcomes.
		if n := len(res.Light.Outcomes); n != load.Light {
			t.Errorf("fair=%d: %d light requests answered, want all %d", fair, n, load.Light)
		}
		for i, out := range res.Light.Outcomes {
			if !out.Complete() {
				t.Errorf("fair=%d: light request %d incomplete: status %d, %d/%d tokens, error %v", fair, i, out.Status, out.Got, out.Want, out.Err)
			}
		}
		if res.Heavy.Count((*e2e.Outcome).Complete) == 0 {
			t.Errorf("fair=%d: the heavy tenant completed no request", fair)
		}
		return res
	}
	fifo, fair := run(0), run(slots)
	if t.Failed() {
		return
	}
	if before, after := fifo.Light.TTFT(0.5), fair.Light.TTFT(0.5); 3*after > before {
		t.Errorf("light tenant's TTFT p50: %v with the fair queue, %v without: want at least 3 times lower", after, before)
	}
}

// TestDemoSpill runs a short -demo-spill over loopback: without a second
// tier the burst gets 429s; with the emulated provider to spill to, none,
// the spilled responses are marked, and once the burst is over requests
// stay on the self-hosted engines again.
func TestDemoSpill(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the emulated engines in real time for several seconds")
	}
	load := spillDemoLoad
	load.Burst.Requests, load.Burst.Rate = 200, 80
	o := options{policy: "default", log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		scrape: 100 * time.Millisecond, slots: spillDemoEngine.MaxRunning}
	alone, err := spillRun(o, load, false)
	if err != nil {
		t.Fatal(err)
	}
	spilled, err := spillRun(o, load, true)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("alone: %d/%d complete, %d 429; with the provider: %d/%d complete, %d 429, %d spilled; after: %d spilled",
		alone.Burst.Count((*e2e.Outcome).Complete), len(alone.Burst.Outcomes), alone.Burst.Count(throttled),
		spilled.Burst.Count((*e2e.Outcome).Complete), len(spilled.Burst.Outcomes), spilled.Burst.Count(throttled),
		spilled.BurstSpilled, spilled.TrickleSpilled)
	if alone.Burst.Count(throttled) == 0 {
		t.Fatal("the burst did not overload the self-hosted engines: nothing to spill")
	}
	if n := spilled.Burst.Count((*e2e.Outcome).Complete); n != len(spilled.Burst.Outcomes) || spilled.Burst.Count(throttled) != 0 {
		t.Errorf("with the provider: %d of %d complete, %d 429; want all complete", n, len(spilled.Burst.Outcomes), spilled.Burst.Count(throttled))
	}
	if spilled.BurstSpilled == 0 || spilled.BurstSpilled == int64(len(spilled.Burst.Outcomes)) {
		t.Errorf("%d of %d burst responses marked as spilled; want some, not all", spilled.BurstSpilled, len(spilled.Burst.Outcomes))
	}
	if spilled.TrickleSpilled != 0 || spilled.Trickle.Count((*e2e.Outcome).Complete) != len(spilled.Trickle.Outcomes) {
		t.Errorf("after the burst: %d spilled, %d of %d complete; want none spilled, all complete",
			spilled.TrickleSpilled, spilled.Trickle.Count((*e2e.Outcome).Complete), len(spilled.Trickle.Outcomes))
	}
}
