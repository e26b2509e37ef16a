package llmlb

import (
	"context"
	"testing"
)

// panicsAfter chooses with inner, then panics, as a policy with a bug in
// its own code after it delegates does.
type panicsAfter struct{ inner Policy }

func (p panicsAfter) Choose(c *Candidates) int {
	p.inner.Choose(c)
	panic("policy bug")
}

// TestActiveBlocksPolicyPanic checks that a pick whose policy panics after
// KVCost added the request's active blocks leaves none held: no Done will
// release them, and every policy sharing the ActiveBlocks would otherwise
// count them at the endpoint for good.
func TestActiveBlocksPolicyPanic(t *testing.T) {
	active, err := NewActiveBlocks(16)
	if err != nil {
		t.Fatal(err)
	}
	cfg := DynamoKVCostConfig()
	cfg.Active = active
	kv, err := KVCost(cfg)
	if err != nil {
		t.Fatal(err)
	}
	b := mustNew(t, panicsAfter{kv})
	mustUpdate(t, b, eps(1))
	panicked := func() (p bool) {
		defer func() { p = recover() != nil }()
		_, _ = b.Pick(context.Background(), &Request{PromptTokens: 160, Prefix: []uint64{1, 2, 3}})
		return false
	}()
	if !panicked {
		t.Fatal("the pick did not panic")
	}
	if n := active.Blocks("ep0"); n != 0 {
		t.Errorf("ep0 holds %d active blocks after a pick whose policy panicked, want 0", n)
	}
	if s := b.Stats()[0]; s.Outstanding != 0 || s.PrefillTokens != 0 || s.DecodeTokens != 0 {
		t.Errorf("ep0 %+v after a pick whose policy panicked, want nothing charged", s)
	}
}
