package llmlb

import (
	"context"
	"testing"

	"github.com/llmlb/llmlb/prefix"
)

// updateDuring is a policy that, once armed, runs during before its inner
// policy chooses: a membership update and other picks that land between a
// pick's snapshot of the membership and its policy's choice.
type updateDuring struct {
	inner  Policy
	during func()
}

func (p *updateDuring) Choose(c *Candidates) int {
	if f := p.during; f != nil {
		p.during = nil
		f()
	}
	return p.inner.Choose(c)
}

// TestPrefixIndexKeepsJoinedEndpointAfterStalePick checks that a pick that
// read the membership before an endpoint joined, and chooses after picks on
// the new membership recorded prompts on that endpoint, does not drop the
// endpoint from the prefix index as if it had left.
func TestPrefixIndexKeepsJoinedEndpointAfterStalePick(t *testing.T) {
	ix, err := prefix.NewIndex(prefix.IndexConfig{})
	if err != nil {
		t.Fatal(err)
	}
	inner, err := PrefixAware(PrefixAwareConfig{Index: ix})
	if err != nil {
		t.Fatal(err)
	}
	pol := &updateDuring{inner: inner}
	b := mustNew(t, pol)
	mustUpdate(t, b, eps(1)) // ep0
	prompt := Request{PromptTokens: 160, Prefix: blocks(7, 10)}
	pickDone(t, b, Request{PromptTokens: 16, Prefix: blocks(1, 1)}) // the policy sees the first membership
	pol.during = func() {
		mustUpdate(t, b, eps(2)) // ep1 joins
		r := prompt
		r.Exclude = []string{"ep0"}
		if k := pickDone(t, b, r); k != "ep1" {
			t.Fatalf("picked %s, want ep1", k)
		}
	}
	// This pick read the membership before ep1 joined.
	pickDone(t, b, Request{PromptTokens: 16, Prefix: blocks(2, 1)})
	if n := ix.Len("ep1"); n == 0 {
		t.Fatal("the prefix index forgot the blocks recorded on ep1, which is still a member")
	}
	pk, err := b.Pick(context.Background(), &prompt)
	if err != nil {
		t.Fatal(err)
	}
	defer pk.Done(nil)
	if k := pk.Endpoint().Key(); k != "ep1" {
		t.Fatalf("a repeat of the prompt recorded on ep1 went to %s", k)
	}
}
