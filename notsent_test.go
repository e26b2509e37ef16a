package llmlb

import (
	"context"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/llmlb/llmlb/prefix"
)

// notSentPolicies builds each prefix-aware policy that records its picks
// into ix, the decisions index.
var notSentPolicies = []struct {
	name string
	new  func(ix *prefix.Index) (Policy, error)
}{
	{"prefix-aware", func(ix *prefix.Index) (Policy, error) { return PrefixAware(PrefixAwareConfig{Index: ix}) }},
	{"sglang-cache-aware", func(ix *prefix.Index) (Policy, error) {
		return SGLangCacheAware(PrefixAwareConfig{Index: ix})
	}},
	{"default", func(ix *prefix.Index) (Policy, error) { return Default(DefaultConfig{Index: ix}) }},
	{"default-events", func(ix *prefix.Index) (Policy, error) {
		events, err := prefix.NewIndex(prefix.IndexConfig{EventsOnly: true})
		if err != nil {
			return nil, err
		}
		return Default(DefaultConfig{Index: ix, Events: events})
	}},
	{"gie-default", func(ix *prefix.Index) (Policy, error) { return GIEDefault(GIEConfig{Index: ix}) }},
	{"kv-cost", func(ix *prefix.Index) (Policy, error) { return KVCost(KVCostConfig{Index: ix}) }},
}

// notSentPicker returns the decisions index of a balancer of one endpoint,
// ep0, with the policy newPolicy builds on it, and a function that picks
// for the first n blocks of prompt there.
func notSentPicker(t *testing.T, newPolicy func(*prefix.Index) (Policy, error), prompt []uint64) (*prefix.Index, func(n int) Pick) {
	t.Helper()
	ix, err := prefix.NewIndex(prefix.IndexConfig{TTL: time.Duration(math.MaxInt64)})
	if err != nil {
		t.Fatal(err)
	}
	pol, err := newPolicy(ix)
	if err != nil {
		t.Fatal(err)
	}
	b := mustNew(t, pol)
	mustUpdate(t, b, eps(1)) // one endpoint: every pick goes to ep0
	return ix, func(n int) Pick {
		t.Helper()
		p, err := b.Pick(context.Background(), &Request{PromptTokens: 16 * n, Prefix: prompt[:n]})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
}

// TestNotSentForgetsRecordedBlocks: a pick whose request was not sent
// (Done with an error wrapping ErrNotSent) leaves the decisions index as it
// was: the endpoint holds the blocks it held before the pick, not those the
// pick recorded. A pick that was sent, or that ended otherwise, keeps them.
func TestNotSentForgetsRecordedBlocks(t *testing.T) {
	notSent := fmt.Errorf("adapter: discarded: %w", ErrNotSent)
	for _, tc := range notSentPolicies {
		t.Run(tc.name, func(t *testing.T) {
			prompt := blocks(1, 8)
			ix, pick := notSentPicker(t, tc.new, prompt)
			now := time.Now()

			// Not sent: nothing stays.
			pick(8).Done(notSent)
			if got := ix.MatchLen("ep0", prompt, now); got != 0 {
				t.Fatalf("after a pick not sent, ep0 holds %d blocks, want 0", got)
			}
			// Sent: the blocks stay; a later pick of a longer prompt that
			// is not sent forgets only what it added.
			pick(4).Done(nil)
			if got := ix.MatchLen("ep0", prompt, now); got != 4 {
				t.Fatalf("after a pick sent, ep0 holds %d blocks, want 4", got)
			}
			pick(8).Done(notSent)
			if got := ix.MatchLen("ep0", prompt, now); got != 4 {
				t.Fatalf("after a longer pick not sent, ep0 holds %d blocks, want the 4 it held", got)
			}
			// A request that streamed was sent, whatever its Done says; a
			// cancel, a failure or a second Done forget nothing.
			p := pick(6)
			p.FirstToken()
			p.Done(notSent)
			if got := ix.MatchLen("ep0", prompt, now); got != 6 {
				t.Fatalf("after a streamed pick, ep0 holds %d blocks, want 6", got)
			}
			p = pick(8)
			p.Done(context.Canceled)
			p.Done(notSent)
			if got := ix.MatchLen("ep0", prompt, now); got != 8 {
				t.Fatalf("after a cancelled pick, ep0 holds %d blocks, want 8", got)
			}
		})
	}
}

// TestNotSentKeepsBlocksOfASentPick: a pick that was not sent forgets the
// blocks it recorded, but not those a later pick with the same prefix,
// which was sent to the same endpoint, matched there or recorded too: that
// endpoint holds them.
func TestNotSentKeepsBlocksOfASentPick(t *testing.T) {
	for _, tc := range notSentPolicies {
		t.Run(tc.name, func(t *testing.T) {
			prompt := blocks(4, 8)
			ix, pick := notSentPicker(t, tc.new, prompt)
			// Both picks of the whole prompt are under way; the first is
			// not sent, the second is.
			first, second := pick(8), pick(8)
			first.Done(ErrNotSent)
			second.Done(nil)
			if got := ix.MatchLen("ep0", prompt, time.Now()); got != 8 {
				t.Fatalf("ep0 holds %d blocks, want the 8 the sent pick put there", got)
			}
			// A shorter prompt of the same prefix keeps its part only.
			ix.Cleared("ep0")
			first, second = pick(8), pick(5)
			first.Done(ErrNotSent)
			second.Done(nil)
			if got := ix.MatchLen("ep0", prompt, time.Now()); got != 5 {
				t.Fatalf("ep0 holds %d blocks, want the 5 the sent pick put there", got)
			}
		})
	}
}

// TestNotSentStridedBlocks: a policy whose index blocks group several of the
// request's blocks (llm-d's router, GIEConfig.MinBlockTokens) forgets the
// groups it recorded.
func TestNotSentStridedBlocks(t *testing.T) {
	ix, err := prefix.NewIndex(prefix.IndexConfig{BlockSize: 16, TTL: time.Duration(math.MaxInt64)})
	if err != nil {
		t.Fatal(err)
	}
	pol, err := GIEDefault(GIEConfig{Index: ix, MinBlockTokens: 64})
	if err != nil {
		t.Fatal(err)
	}
	b := mustNew(t, pol)
	mustUpdate(t, b, eps(1))
	prompt := blocks(2, 12) // three groups of four
	groups := []uint64{prompt[3], prompt[7], prompt[11]}
	p, err := b.Pick(context.Background(), &Request{PromptTokens: 64, Prefix: prompt[:4]})
	if err != nil {
		t.Fatal(err)
	}
	p.Done(nil)
	p, err = b.Pick(context.Background(), &Request{PromptTokens: 192, Prefix: prompt})
	if err != nil {
		t.Fatal(err)
	}
	if got := ix.MatchLen("ep0", groups, time.Now()); got != 3 {
		t.Fatalf("the pick recorded %d groups, want 3", got)
	}
	p.Done(ErrNotSent)
	if got, n := ix.MatchLen("ep0", groups, time.Now()), ix.Len("ep0"); got != 1 || n != 1 {
		t.Fatalf("after the pick not sent, ep0 matches %d groups and holds %d, want the 1 it held", got, n)
	}
}

// TestNotSentKeepsNoPrefix: Done releases the request's Prefix, which the
// caller owns, whether or not the request was sent.
func TestNotSentKeepsNoPrefix(t *testing.T) {
	pol, err := PrefixAware(PrefixAwareConfig{})
	if err != nil {
		t.Fatal(err)
	}
	b := mustNew(t, pol)
	mustUpdate(t, b, eps(2))
	for _, err := range []error{nil, ErrNotSent} {
		p, perr := b.Pick(context.Background(), &Request{PromptTokens: 64, Prefix: blocks(3, 4)})
		if perr != nil {
			t.Fatal(perr)
		}
		aux := p.rec.aux
		if aux == nil || aux.undo.t == nil || len(aux.undo.prefix) != 4 {
			t.Fatalf("the pick's record keeps %+v, want the 4 blocks it recorded", aux)
		}
		rec := p.rec
		p.Done(err)
		if rec.aux != nil || aux.undo.t != nil || aux.undo.prefix != nil {
			t.Fatalf("Done(%v) kept the request's Prefix", err)
		}
	}
}

// TestNotSentNotTakenOffObservation: a request that was never sent is not
// one the engine's observation counted, so its Done takes nothing off the
// observation's requests, where a request that reached the engine and
// ended before streaming takes one off its waiting ones.
func TestNotSentNotTakenOffObservation(t *testing.T) {
	_, clock, sig, p, pick := signalProbe(t)
	x, y := pick(), pick()
	sig.Set("ep0", Load{At: clock.Now(), Running: 1, Waiting: 3, KVUsage: math.NaN()})
	clock.Advance(10 * time.Millisecond)
	check := func(when string, requests, waiting int64) {
		t.Helper()
		pick().Done(nil) // refreshes p.loads; finished at once, it adds nothing
		if l := p.loads["ep0"]; !l.Fresh || l.Requests != requests || l.Waiting != waiting {
			t.Fatalf("%s: requests %d, waiting %d; want %d, %d", when, l.Requests, l.Waiting, requests, waiting)
		}
	}
	check("at the observation", 4, 3)
	x.Done(fmt.Errorf("connection refused: %w", ErrNotSent))
	check("after a request not sent", 4, 3)
	y.Done(context.Canceled)
	check("after a request cancelled while waiting", 3, 2)
}
