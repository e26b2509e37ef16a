package share

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmlb/llmlb"
)

// This replica's work is charged as the balancer charges it: a request of
// several completions (Request.Choices) decodes each of them, and one
// without an output estimate is charged the balancer's allowance or the
// output length it learned (llmlb.WithOutputPrediction), which the Group
// reads from the pick rather than computing again.
func TestLocalTokensMatchBalancer(t *testing.T) {
	setup := func(t *testing.T) (*Group, *llmlb.Balancer, func(*llmlb.Request) llmlb.Pick) {
		clock := &fakeClock{t: at(0)}
		g := offline(t, Config{ID: "a", Clock: clock})
		b, err := llmlb.New(llmlb.RoundRobin(), llmlb.WithClock(clock), llmlb.WithDecodeAllowance(300),
			llmlb.WithOutputPrediction(llmlb.OutputConfig{MinObservations: 1}), llmlb.WithObserver(g.Observer(nil)))
		require.NoError(t, err)
		require.NoError(t, b.Update([]llmlb.Endpoint{key("e1")}))
		return g, b, func(r *llmlb.Request) llmlb.Pick {
			t.Helper()
			p, err := b.Pick(context.Background(), r)
			require.NoError(t, err)
			s, ok := b.StatsOf("e1")
			require.True(t, ok)
			_, _, tokens := g.local.totals("e1")
			require.Equal(t, s.PrefillTokens+s.DecodeTokens, tokens, "after a pick of %+v", *r)
			return p
		}
	}
	t.Run("choices", func(t *testing.T) {
		_, _, check := setup(t)
		for _, r := range []*llmlb.Request{
			{PromptTokens: 100, OutputTokens: 50, Choices: 4},
			{PromptTokens: 10, MaxTokens: 200, Choices: 3},
			{PromptTokens: 10, Choices: 2},
			{PromptTokens: 10, OutputTokens: 1 << 20, Choices: 1 << 16}, // charged at most 2^31-1
			{PromptTokens: 7, OutputTokens: 5},
		} {
			check(r)
		}
	})
	t.Run("predicted", func(t *testing.T) {
		// A feature whose requests answered 40 tokens: the next is
		// charged 40, not the allowance.
		_, b, check := setup(t)
		p := check(&llmlb.Request{PromptTokens: 10, Feature: "summary"})
		p.FirstToken()
		p.Generated(40)
		p.Done(nil)
		check(&llmlb.Request{PromptTokens: 10, Feature: "summary", Choices: 2})
		s, _ := b.StatsOf("e1")
		require.EqualValues(t, 80, s.DecodeTokens, "the learned length charged")
	})
}
