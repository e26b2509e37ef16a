package llmlb

import (
	"context"
	"math"
	"testing"

	"github.com/llmlb/llmlb/prefix"
)

func TestDefaultPrefersCachedHolderUntilItsQueueCostsMore(t *testing.T) {
	ix, _ := prefix.NewIndex(prefix.IndexConfig{})
	pol, err := Default(DefaultConfig{Index: ix})
	if err != nil {
		t.Fatal(err)
	}
	b := mustNew(t, pol)
	mustUpdate(t, b, eps(4))
	prompt := blocks(2, 100) // 1600 tokens, all cached on ep3
	_ = ix.Stored("ep3", 16, prompt...)
	req := Request{PromptTokens: 1600, OutputTokens: 10, Prefix: prompt}
	pk, _ := b.Pick(context.Background(), &req)
	if k := pk.Endpoint().Key(); k != "ep3" {
		t.Fatalf("picked %s, want the holder ep3", k)
	}
	pk.Done(nil)
	// With the default weights an idle endpoint costs k*1600 = 6400 (the
	// whole prompt uncached) and the holder, behind w waiting requests of
	// Q queued prompt tokens (each with a 256-token decode allowance),
	// costs Q + w*1600 (the mean prompt) + 0.5*(Q + 256w): one request of
	// 3000 tokens costs 6228 and the holder wins; two of 5000 cost 10828
	// and it loses.
	held := holdOn(t, b, "ep3", 1, Request{PromptTokens: 3000, MaxTokens: 256})
	pk, _ = b.Pick(context.Background(), &req)
	if k := pk.Endpoint().Key(); k != "ep3" {
		t.Fatalf("picked %s with 3000 queued tokens on the holder, want ep3", k)
	}
	pk.Done(nil)
	held = append(held, holdOn(t, b, "ep3", 1, Request{PromptTokens: 2000, MaxTokens: 1})...)
	pk, _ = b.Pick(context.Background(), &req)
	if k := pk.Endpoint().Key(); k == "ep3" {
		t.Fatal("picked the holder behind 5000 queued tokens to save 1600")
	}
	pk.Done(nil)
	for _, h := range held {
		h.Done(nil)
	}
	for _, bad := range []DefaultConfig{{KVPenalty: -1}, {CacheWeight: math.NaN()}, {FootprintWeight: math.Inf(1)}, {Sampled: -1}, {Holders: -2}} {
		if _, err := Default(bad); err == nil {
			t.Errorf("config %+v accepted", bad)
		}
	}
}

func TestDefaultSamplesHoldersAndRandom(t *testing.T) {
	ix, _ := prefix.NewIndex(prefix.IndexConfig{})
	pol, _ := Default(DefaultConfig{Index: ix, Sampled: 2})
	b := mustNew(t, pol)
	mustUpdate(t, b, eps(16))
	// Without prefixes the policy spreads load like P2C over prefill work:
	// after many held requests no endpoint holds far more than the mean.
	var held []Pick
	for range 1600 {
		pk, err := b.Pick(context.Background(), &Request{PromptTokens: 500})
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, pk)
	}
	for _, s := range b.Stats() {
		if s.Outstanding > 130 || s.Outstanding < 70 {
			t.Errorf("%s holds %d of 1600 requests on 16 endpoints", s.Key, s.Outstanding)
		}
	}
	for _, h := range held {
		h.Done(nil)
	}
}
