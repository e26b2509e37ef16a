package llmlb

import (
	"context"
	"testing"

	"github.com/llmlb/llmlb/prefix"
)

// TestSGLangCacheAwareMissGoesToLeastLoaded checks SGLang's rule since its
// PR 14650: a request whose best match is at or below the threshold goes to
// the candidate with the fewest requests in flight from this router, not to
// the one with the smallest tree, and the engine signal does not enter into
// it. MissToSmallestTree restores the earlier rule.
func TestSGLangCacheAwareMissGoesToLeastLoaded(t *testing.T) {
	for _, tc := range []struct {
		name         string
		smallestTree bool
		want         string
	}{
		{"today", false, "ep2"},
		{"before PR 14650", true, "ep3"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ix, _ := prefix.NewIndex(prefix.IndexConfig{})
			pol, err := SGLangCacheAware(PrefixAwareConfig{Index: ix, MissToSmallestTree: tc.smallestTree})
			if err != nil {
				t.Fatal(err)
			}
			clock, sig := newFakeClock(), &fakeSignal{}
			b := mustNew(t, pol, WithClock(clock), WithSignal(sig, 0))
			mustUpdate(t, b, eps(4))
			// ep0..ep2 have trees of 5 blocks, ep3 none: ep3 is the
			// smallest tree. In flight: ep0 2, ep1 2, ep2 1, ep3 3, well
			// under the imbalance threshold: ep2 is the least loaded.
			for i := range 3 {
				_ = ix.Record("ep"+string(rune('0'+i)), blocks(50+i, 5), clock.Now())
			}
			var held []Pick
			for key, n := range map[string]int{"ep0": 2, "ep1": 2, "ep2": 1, "ep3": 3} {
				held = append(held, holdOn(t, b, key, n, Request{})...)
			}
			// The engines report ep2 as the busiest; SGLang never reads that.
			for key, running := range map[string]int{"ep0": 0, "ep1": 0, "ep2": 1000, "ep3": 0} {
				sig.Set(key, Load{At: clock.Now(), Running: running, KVUsage: 0})
			}
			pk, err := b.Pick(context.Background(), &Request{PromptTokens: 64, Prefix: blocks(9, 4)})
			if err != nil {
				t.Fatal(err)
			}
			if got := pk.Endpoint().Key(); got != tc.want {
				t.Fatalf("a miss went to %s, want %s", got, tc.want)
			}
			pk.Done(nil)
			for _, h := range held {
				h.Done(nil)
			}
		})
	}
}

// TestSGLangCacheAwareTiesAreRandom checks SGLang PR 33138: misses among
// equally loaded candidates spread over all of them rather than going to
// the first.
func TestSGLangCacheAwareTiesAreRandom(t *testing.T) {
	ix, _ := prefix.NewIndex(prefix.IndexConfig{})
	pol, err := SGLangCacheAware(PrefixAwareConfig{Index: ix})
	if err != nil {
		t.Fatal(err)
	}
	b := mustNew(t, pol)
	mustUpdate(t, b, eps(4))
	seen := map[string]int{}
	for i := range 200 {
		pk, err := b.Pick(context.Background(), &Request{PromptTokens: 64, Prefix: blocks(100+i, 4)})
		if err != nil {
			t.Fatal(err)
		}
		seen[pk.Endpoint().Key()]++
		pk.Done(nil)
	}
	if len(seen) != 4 {
		t.Fatalf("misses at equal load went to %v, want all four endpoints", seen)
	}
}

// TestGIEDefaultRawMetricsAndPrefixCap checks two details of the inference
// gateway's picker: it scores the engines' metrics as polled, without this
// router's dispatches since the poll, and its prefix index hashes, matches
// and records only a prompt's first 256 blocks.
func TestGIEDefaultRawMetricsAndPrefixCap(t *testing.T) {
	t.Run("raw metrics", func(t *testing.T) {
		clock, sig := newFakeClock(), &fakeSignal{}
		pol, err := GIEDefault(GIEConfig{})
		if err != nil {
			t.Fatal(err)
		}
		b := mustNew(t, pol, WithClock(clock), WithSignal(sig, 0))
		mustUpdate(t, b, eps(2))
		sig.Set("ep0", Load{At: clock.Now(), KVUsage: 0.2})
		sig.Set("ep1", Load{At: clock.Now(), KVUsage: 0.2})
		// Five dispatches to ep0 since the poll: a corrected estimate
		// would see 5 waiting there and never pick it; the picker sees
		// equal queues and breaks the tie at random.
		held := holdOn(t, b, "ep0", 5, Request{})
		seen := map[string]int{}
		for range 100 {
			pk, err := b.Pick(context.Background(), &Request{PromptTokens: 64})
			if err != nil {
				t.Fatal(err)
			}
			seen[pk.Endpoint().Key()]++
			pk.Done(nil)
		}
		if seen["ep0"] == 0 || seen["ep1"] == 0 {
			t.Fatalf("picks %v, want both endpoints (equal polled metrics)", seen)
		}
		for _, h := range held {
			h.Done(nil)
		}
	})
	t.Run("256 blocks", func(t *testing.T) {
		clock, sig := newFakeClock(), &fakeSignal{}
		ix, _ := prefix.NewIndex(prefix.IndexConfig{})
		pol, err := GIEDefault(GIEConfig{Index: ix})
		if err != nil {
			t.Fatal(err)
		}
		b := mustNew(t, pol, WithClock(clock), WithSignal(sig, 0))
		mustUpdate(t, b, eps(3))
		prompt := blocks(3, 300)
		_ = ix.Stored("ep0", 16, prompt...)
		_ = ix.Stored("ep1", 16, prompt[:DefaultGIEMaxPrefixBlocks]...)
		// queue scores 0.9, 1 and 0 (weight 2), KV equal. Matching all 300
		// blocks, ep0 would win: 3 + 1.8 against 3*256/300 + 2. Within the
		// 256 hashed blocks both match fully and ep1's shorter queue wins.
		for key, waiting := range map[string]int{"ep0": 1, "ep1": 0, "ep2": 10} {
			sig.Set(key, Load{At: clock.Now(), Waiting: waiting, KVUsage: 0})
		}
		pk, err := b.Pick(context.Background(), &Request{PromptTokens: 300 * 16, Prefix: prompt})
		if err != nil {
			t.Fatal(err)
		}
		if got := pk.Endpoint().Key(); got != "ep1" {
			t.Fatalf("picked %s, want ep1 (both hold the 256 hashed blocks)", got)
		}
		pk.Done(nil)
		// A new prompt is recorded only up to its 256th block.
		fresh := blocks(4, 300)
		pk, err = b.Pick(context.Background(), &Request{PromptTokens: 300 * 16, Prefix: fresh})
		if err != nil {
			t.Fatal(err)
		}
		pk.Done(nil)
		m := ix.Match(fresh, clock.Now(), nil)
		if len(m) != 1 || m[0].Blocks != DefaultGIEMaxPrefixBlocks {
			t.Fatalf("recorded %v, want one endpoint holding %d blocks", m, DefaultGIEMaxPrefixBlocks)
		}
	})
}

// TestPrefixHashIgnoresSignal checks that PrefixHash, like SGLang's
// prefix_hash, bounds the owner's load by this router's requests in flight
// and not by what the engines report.
func TestPrefixHashIgnoresSignal(t *testing.T) {
	pol, err := PrefixHash(PrefixHashConfig{})
	if err != nil {
		t.Fatal(err)
	}
	clock, sig := newFakeClock(), &fakeSignal{}
	b := mustNew(t, pol, WithClock(clock), WithSignal(sig, 0))
	mustUpdate(t, b, eps(4))
	req := &Request{PromptTokens: 512, Prefix: blocks(8, 32)}
	pk, _ := b.Pick(context.Background(), req)
	owner := pk.Endpoint().Key()
	pk.Done(nil)
	sig.Set(owner, Load{At: clock.Now(), Running: 500, Waiting: 500, KVUsage: 1})
	for range 10 {
		pk, _ := b.Pick(context.Background(), req)
		if got := pk.Endpoint().Key(); got != owner {
			t.Fatalf("went to %s, want the owner %s: its reported load must not count", got, owner)
		}
		pk.Done(nil)
	}
}
