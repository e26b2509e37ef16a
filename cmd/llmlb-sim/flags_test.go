package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/llmlb/llmlb/internal/sim"
	"github.com/llmlb/llmlb/share"
)

// The command's bounds are those of the packages that would refuse a run
// beyond them: each is accepted there, and one more is not.
func TestFlagLimits(t *testing.T) {
	engine := func(e sim.Engine) error { return e.Normalize() }
	group := func(cfg share.Config) error { _, err := share.New(cfg); return err }
	cases := []struct {
		name      string
		at, above error
	}{
		{"kv-blocks", engine(sim.Engine{KVBlocks: maxKVBlocks}), engine(sim.Engine{KVBlocks: maxKVBlocks + 1})},
		{"adapter-slots", engine(sim.Engine{AdapterSlots: maxAdapterSlots}), engine(sim.Engine{AdapterSlots: maxAdapterSlots + 1})},
		{"adapter-load", engine(sim.Engine{AdapterLoad: maxAdapterLoad}), engine(sim.Engine{AdapterLoad: maxAdapterLoad + 1})},
		{"share", group(share.Config{Interval: maxShare}), group(share.Config{Interval: maxShare + 1})},
		{"share signal age", group(share.Config{MaxSignalAge: maxShareSignalAge}), group(share.Config{MaxSignalAge: maxShareSignalAge + 1})},
	}
	for _, c := range cases {
		if c.at != nil || c.above == nil {
			t.Errorf("%s: at the bound %v, above it %v; want it accepted, then refused", c.name, c.at, c.above)
		}
	}
	if 3*maxInterval < maxInterval {
		t.Errorf("three times -scrape's bound %v overflows", maxInterval)
	}
}

// Every flag at its bound runs; the errors beyond are in TestRunErrors.
func TestRunFlagsAtLimits(t *testing.T) {
	for _, args := range [][]string{
		{"-scrape", maxInterval.String(), "-signal-interval", maxInterval.String()},
		{"-slo-ttft", maxDuration.String(), "-slo-tpot", maxDuration.String()},
		{"-kv-blocks", "16777216"},
		{"-adapter-slots", "65536", "-adapter-load", "1m"},
		{"-routers", "2", "-share", "1m", "-scrape", "80m"},
		{"-routers", "2", "-share", "1ms", "-signal-interval", "80m"},
		{"-replicas", "2", "-policies", "pd-default"},
		// -signal-interval overrides -scrape; a preset with its own
		// interval ignores -scrape.
		{"-routers", "2", "-share", "10ms", "-scrape", "81m", "-signal-interval", "1s"},
		{"-routers", "2", "-share", "10ms", "-scrape", "81m", "-signal-interval", "0", "-policies", "gie-default"},
		// Staggered: k*interval must not overflow for router k.
		{"-routers", "8", "-stagger", "-scrape", (maxDuration / 7).String()},
		{"-routers", "8", "-stagger", "-scrape", "400000h", "-policies", "gie-default"},
		{"-routers", "4", "-stagger", "-signal-interval", maxInterval.String()},
		{"-adapter-slots", "2", "-adapter-load", "1ns"},
	} {
		var out, errb bytes.Buffer
		args = append([]string{"-requests", "50", "-replicas", "2", "-policies", "p2c"}, args...)
		if code := run(context.Background(), args, &out, &errb); code != 0 {
			t.Errorf("%v: exit %d: %s", args, code, errb.String())
		}
	}
}

// A duration flag's parse error names the flag and says what is wrong;
// a duration too large for time.Duration is out of range, not "no
// duration", and the message gives the flag's range.
func TestDurationFlagErrors(t *testing.T) {
	slo := durationFlag{name: "slo-ttft", min: time.Nanosecond, max: maxDuration}
	scrape := durationFlag{name: "scrape", min: time.Millisecond, max: maxInterval, zero: "the scenario's"}
	cases := []struct {
		f    durationFlag
		in   string
		want string
	}{
		{slo, "9999999h", `invalid -slo-ttft "9999999h": out of range: want a duration from 1ns to 2562047h47m16.854775807s`},
		{slo, "-9999999h", `invalid -slo-ttft "-9999999h": out of range: want a duration from 1ns to 2562047h47m16.854775807s`},
		{slo, "9223372036854775808ns", `invalid -slo-ttft "9223372036854775808ns": out of range`},
		{slo, "2562047h47m16.854775808s", `invalid -slo-ttft "2562047h47m16.854775808s": out of range`},
		{slo, "99999999999999999999us", `out of range`},
		{scrape, "9999999h", `invalid -scrape "9999999h": out of range: want a duration from 1ms to 854015h55m45.618258602s, or 0 for the scenario's`},
		{slo, "2", `invalid -slo-ttft "2": a duration needs a unit, such as 2s or 500ms`},
		{slo, "9999999999999999999", `a duration needs a unit`},
		{slo, "soon", `invalid -slo-ttft "soon": want a duration, such as 2s or 500ms`},
		{slo, "9999999x", `want a duration, such as 2s or 500ms`},
		{slo, "9999999h5", `want a duration, such as 2s or 500ms`},
		{slo, ".h", `want a duration, such as 2s or 500ms`},
	}
	for _, c := range cases {
		var d time.Duration
		var bad error
		c.f.d, c.f.bad = &d, &bad
		if err := c.f.Set(c.in); err == nil || bad == nil || !strings.Contains(bad.Error(), c.want) {
			t.Errorf("-%s %s: error %v, recorded %v; want one holding %q", c.f.name, c.in, err, bad, c.want)
		}
	}
}

func TestShortDuration(t *testing.T) {
	for d, want := range map[time.Duration]string{
		0:                       "0s",
		time.Minute:             "1m",
		4 * time.Hour:           "4h",
		80 * time.Minute:        "1h20m",
		61 * time.Second:        "1m1s",
		time.Hour + time.Second: "1h0m1s",
		1500 * time.Microsecond: "1.5ms",
		maxDuration:             "2562047h47m16.854775807s",
	} {
		if got := shortDuration(d); got != want {
			t.Errorf("shortDuration(%v) = %q, want %q", d, got, want)
		}
	}
}
