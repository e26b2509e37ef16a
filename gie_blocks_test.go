package llmlb

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/llmlb/llmlb/prefix"
)

// TestGIEMinBlockTokens checks llm-d's coarser blocks: 16-token prefix blocks
// grouped four at a time, a partial group not hashed, and the index sized
// at one entry per engine KV block.
func TestGIEMinBlockTokens(t *testing.T) {
	ix, err := prefix.NewIndex(prefix.IndexConfig{BlockSize: 16, TTL: time.Duration(math.MaxInt64)})
	if err != nil {
		t.Fatal(err)
	}
	pol, err := GIEDefault(GIEConfig{Index: ix, MinBlockTokens: 64})
	if err != nil {
		t.Fatal(err)
	}
	sig := &fakeSignal{}
	b := mustNew(t, pol, WithSignal(sig, time.Hour))
	mustUpdate(t, b, eps(2))
	for _, key := range []string{"ep0", "ep1"} {
		sig.Set(key, Load{At: time.Now(), KVBlocks: 1000, BlockSize: 16})
	}
	prompt := blocks(1, 11) // 11 blocks of 16 tokens: two groups of 64
	pk, err := b.Pick(context.Background(), &Request{PromptTokens: 176, Prefix: prompt})
	if err != nil {
		t.Fatal(err)
	}
	key := pk.Endpoint().Key()
	pk.Done(nil)
	if got := ix.Len(key); got != 2 {
		t.Fatalf("index holds %d blocks for %s, want 2 groups of 4", got, key)
	}
	if got := ix.MatchLen(key, []uint64{prompt[3], prompt[7]}, time.Now()); got != 2 {
		t.Fatalf("the groups' last hashes match %d blocks, want 2", got)
	}
	if got := ix.MatchLen(key, prompt[:4], time.Now()); got != 0 {
		t.Fatalf("the first group's own blocks match %d, want 0: only a group's last hash is recorded", got)
	}
	// One entry per engine block, each standing for 64 tokens: 1,000, not
	// the 250 that hold the engine's 16,000 tokens.
	if got := ix.Capacity(key); got != 1000 {
		t.Fatalf("index capacity %d, want 1000", got)
	}

	// Without MinBlockTokens, the v1.5.0 picker: every block, capacity in
	// the engine's tokens.
	ix2, _ := prefix.NewIndex(prefix.IndexConfig{BlockSize: 16, TTL: time.Duration(math.MaxInt64)})
	pol2, err := GIEDefault(GIEConfig{Index: ix2})
	if err != nil {
		t.Fatal(err)
	}
	b2 := mustNew(t, pol2, WithSignal(sig, time.Hour))
	mustUpdate(t, b2, eps(2))
	pk, err = b2.Pick(context.Background(), &Request{PromptTokens: 176, Prefix: prompt})
	if err != nil {
		t.Fatal(err)
	}
	key = pk.Endpoint().Key()
	pk.Done(nil)
	if got, got2 := ix2.Len(key), ix2.Capacity(key); got != 11 || got2 != 1000 {
		t.Fatalf("v1.5.0 picker: %d blocks with capacity %d, want 11 and 1000", got, got2)
	}

	for _, n := range []int{-1, 1<<24 + 1} {
		if _, err := GIEDefault(GIEConfig{MinBlockTokens: n}); !errors.Is(err, ErrInvalidPolicy) {
			t.Errorf("MinBlockTokens %d: %v, want ErrInvalidPolicy", n, err)
		}
	}
}

// TestGIEMinBlockTokensMatch checks that the prefix score counts groups: a
// replica holding the prompt's first group of two wins against an idle one
// only by that half.
func TestGIEMinBlockTokensMatch(t *testing.T) {
	ix, _ := prefix.NewIndex(prefix.IndexConfig{BlockSize: 16, TTL: time.Duration(math.MaxInt64)})
	pol, err := GIEDefault(GIEConfig{Index: ix, MinBlockTokens: 64})
	if err != nil {
		t.Fatal(err)
	}
	b := mustNew(t, pol)
	mustUpdate(t, b, eps(2))
	prompt := blocks(3, 8)
	if err := ix.Record("ep1", []uint64{prompt[3]}, time.Now()); err != nil {
		t.Fatal(err)
	}
	for range 10 {
		pk, err := b.Pick(context.Background(), &Request{PromptTokens: 128, Prefix: prompt})
		if err != nil {
			t.Fatal(err)
		}
		if got := pk.Endpoint().Key(); got != "ep1" {
			t.Fatalf("picked %s, want ep1, which holds the first 64 tokens", got)
		}
		pk.Done(nil)
	}
}
