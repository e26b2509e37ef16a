package llmlb

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/llmlb/llmlb/prefix"
)

// recorder keeps every event an Observer receives.
type recorder struct {
	picks  []PickInfo
	firsts []FirstTokenInfo
	dones  []DoneInfo
}

func (r *recorder) observer() *Observer {
	return &Observer{
		Pick:       func(p PickInfo) { r.picks = append(r.picks, p) },
		FirstToken: func(f FirstTokenInfo) { r.firsts = append(r.firsts, f) },
		Done:       func(d DoneInfo) { r.dones = append(r.dones, d) },
	}
}

func TestObserver(t *testing.T) {
	clk := newFakeClock()
	sig := &fakeSignal{}
	sig.Set("ep0", Load{Running: 1, At: clk.Now().Add(-3 * time.Second)})
	ix, err := prefix.NewIndex(prefix.IndexConfig{})
	if err != nil {
		t.Fatal(err)
	}
	pol, err := PrefixAware(PrefixAwareConfig{Index: ix})
	if err != nil {
		t.Fatal(err)
	}
	var rec recorder
	b, err := New(pol, WithClock(clk), WithSignal(sig, 10*time.Second), WithObserver(rec.observer()))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := b.Pick(ctx, &Request{}); !errors.Is(err, ErrNoEndpoints) {
		t.Fatalf("pick on an empty pool: %v", err)
	}
	if err := b.Update(eps(1)); err != nil {
		t.Fatal(err)
	}
	blocks := []uint64{1, 2, 3, 4}
	req := &Request{PromptTokens: 80, Prefix: blocks}
	first, err := b.Pick(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	clk.Advance(250 * time.Millisecond)
	first.FirstToken()
	first.FirstToken() // not effective: no second event
	clk.Advance(750 * time.Millisecond)
	first.Done(nil)
	first.Done(nil) // not effective

	second, err := b.Pick(ctx, req) // the index now holds the 4 blocks
	if err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	clk.Advance(time.Second)
	second.Done(boom)
	first.Done(nil) // a stale handle: its record now serves another request, or none

	if _, err := b.Pick(ctx, &Request{Exclude: []string{"ep0"}}); !errors.Is(err, ErrNoCandidates) {
		t.Fatalf("pick excluding everything: %v", err)
	}
	if _, err := b.Pick(ctx, &Request{PromptTokens: -1}); !errors.Is(err, ErrInvalidRequest) {
		t.Fatalf("invalid request: %v", err)
	}

	if len(rec.picks) != 4 {
		t.Fatalf("%d pick events, want 4 (the invalid request is not one): %+v", len(rec.picks), rec.picks)
	}
	if p := rec.picks[0]; !errors.Is(p.Err, ErrNoEndpoints) || p.Endpoint != nil || p.SignalAge != -1 {
		t.Errorf("empty-pool pick event = %+v", p)
	}
	p := rec.picks[1]
	if p.Err != nil || p.Endpoint.Key() != "ep0" || p.Request != req || p.Candidates != 1 || p.CachedTokens != 0 {
		t.Errorf("first pick event = %+v", p)
	}
	if p.SignalAge != 3*time.Second {
		t.Errorf("first pick's signal age = %v, want 3s", p.SignalAge)
	}
	if p := rec.picks[2]; p.CachedTokens != 64 {
		t.Errorf("second pick's cached tokens = %d, want 64 (4 blocks of 16)", p.CachedTokens)
	}
	if p := rec.picks[3]; !errors.Is(p.Err, ErrNoCandidates) {
		t.Errorf("excluded pick event = %+v", p)
	}
	if len(rec.firsts) != 1 || rec.firsts[0].Latency != 250*time.Millisecond || rec.firsts[0].Endpoint.Key() != "ep0" {
		t.Errorf("first-token events = %+v, want one of 250ms", rec.firsts)
	}
	if len(rec.dones) != 2 {
		t.Fatalf("%d done events, want 2: %+v", len(rec.dones), rec.dones)
	}
	if d := rec.dones[0]; d.Latency != time.Second || !d.Streamed || d.Err != nil {
		t.Errorf("first done event = %+v, want 1s, streamed", d)
	}
	if d := rec.dones[1]; d.Latency != time.Second || d.Streamed || d.Err != boom {
		t.Errorf("second done event = %+v, want 1s, not streamed, boom", d)
	}
}

// PickInfo.DecodeTokens is the decode the pick charged, as the endpoint's
// stats count it, on every path: the policies without candidates and those
// with, for an estimate, the allowance capped by MaxTokens, a learned
// length and several completions.
func TestPickInfoDecodeTokens(t *testing.T) {
	for _, policy := range []Policy{RoundRobin(), LeastOutstanding()} {
		var rec recorder
		b := mustNew(t, policy, WithObserver(rec.observer()), WithDecodeAllowance(300),
			WithOutputPrediction(OutputConfig{MinObservations: 1}))
		mustUpdate(t, b, eps(1))
		taught := false
		for _, r := range []*Request{
			nil,
			{PromptTokens: 10},
			{PromptTokens: 10, MaxTokens: 20},
			{PromptTokens: 10, OutputTokens: 50, Choices: 3},
			{PromptTokens: 10, MaxTokens: 200, Choices: 2},
			{PromptTokens: 10, Feature: "f"},
			{PromptTokens: 10, Feature: "f", Choices: 4},
		} {
			before, _ := b.StatsOf("ep0")
			p, err := b.Pick(context.Background(), r)
			if err != nil {
				t.Fatal(err)
			}
			after, _ := b.StatsOf("ep0")
			got := rec.picks[len(rec.picks)-1].DecodeTokens
			if want := after.DecodeTokens - before.DecodeTokens; int64(got) != want {
				t.Errorf("%T, request %+v: PickInfo.DecodeTokens %d, the stats charged %d", policy, r, got, want)
			}
			if r != nil && r.Feature == "f" && !taught {
				// Teach the feature 40 tokens: later picks of it are
				// charged that.
				p.FirstToken()
				p.Generated(40)
				p.Done(nil)
				taught = true
			}
		}
		if got := rec.picks[len(rec.picks)-1].DecodeTokens; got != 160 {
			t.Errorf("%T: 4 completions of a feature learned at 40 tokens charged %d, want 160", policy, got)
		}
	}
}

func TestWithObserverErrors(t *testing.T) {
	if _, err := New(RoundRobin(), WithObserver(nil)); !errors.Is(err, ErrInvalidOption) {
		t.Errorf("WithObserver(nil): %v", err)
	}
	b, err := New(RoundRobin(), WithObserver(&Observer{}))
	if err != nil {
		t.Fatal(err)
	}
	if b.obs != nil {
		t.Error("an Observer with no functions is kept")
	}
}

// With an observer whose functions do nothing, Pick and Done still allocate
// nothing.
func TestObserverDoesNotAllocate(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are not meaningful under -race")
	}
	nop := &Observer{Pick: func(PickInfo) {}, FirstToken: func(FirstTokenInfo) {}, Done: func(DoneInfo) {}}
	b, err := New(P2C(nil), WithObserver(nop))
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Update(eps(8)); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	req := &Request{PromptTokens: 100}
	if n := testing.AllocsPerRun(1000, func() {
		p, err := b.Pick(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		p.FirstToken()
		p.Done(nil)
	}); n != 0 {
		t.Errorf("Pick+FirstToken+Done with an observer: %v allocs, want 0", n)
	}
}

// BenchmarkPickObserver measures Pick, FirstToken and Done on 64 endpoints
// with P2C, without an observer and with one whose functions do nothing
// (the hook's own cost: three clock reads and three calls).
func BenchmarkPickObserver(b *testing.B) {
	nop := &Observer{Pick: func(PickInfo) {}, FirstToken: func(FirstTokenInfo) {}, Done: func(DoneInfo) {}}
	for _, c := range []struct {
		name string
		opts []Option
	}{{"observer=unset", nil}, {"observer=nop", []Option{WithObserver(nop)}}} {
		b.Run(c.name, func(b *testing.B) {
			benchPickLoop(b, benchBalancer(b, P2C(nil), 64, c.opts...), true)
		})
	}
}
