package llmlb

import (
	"context"
	"errors"
	"testing"

	"github.com/llmlb/llmlb/prefix"
)

// TestKVCostNoDecode checks that NoDecode prices the prefill alone, as
// Dynamo's prefill router does, where the default counts the prompts
// decoding at each endpoint.
func TestKVCostNoDecode(t *testing.T) {
	prompt := blocks(1, 10)
	for _, tc := range []struct {
		noDecode bool
		want     string
	}{
		// ep0 holds half the prompt but decodes a 50-block prompt: 5 + 50
		// + 10 against 10 + 10 for ep1.
		{false, "ep1"},
		// Without the decode term: 5 against 10.
		{true, "ep0"},
	} {
		ix, _ := prefix.NewIndex(prefix.IndexConfig{BlockSize: 16})
		if err := ix.Stored("ep0", 16, prompt[:5]...); err != nil {
			t.Fatal(err)
		}
		cfg := DynamoKVCostConfig()
		cfg.Index, cfg.NoDecode = ix, tc.noDecode
		pol, err := KVCost(cfg)
		if err != nil {
			t.Fatal(err)
		}
		b := mustNew(t, pol)
		mustUpdate(t, b, eps(2))
		held := holdOn(t, b, "ep0", 1, Request{PromptTokens: 800, OutputTokens: 100})
		held[0].FirstToken()
		for range 10 {
			pk, err := b.Pick(context.Background(), &Request{PromptTokens: 160, OutputTokens: 1, Prefix: prompt})
			if err != nil {
				t.Fatal(err)
			}
			if got := pk.Endpoint().Key(); got != tc.want {
				t.Fatalf("NoDecode %v: picked %s, want %s", tc.noDecode, got, tc.want)
			}
			pk.Done(nil)
		}
		held[0].Done(nil)
	}
	active, _ := NewActiveBlocks(16)
	cfg := DynamoKVCostConfig()
	cfg.NoDecode, cfg.Active = true, active
	if _, err := KVCost(cfg); !errors.Is(err, ErrInvalidPolicy) {
		t.Fatalf("KVCost with NoDecode and Active: %v, want ErrInvalidPolicy", err)
	}
}
