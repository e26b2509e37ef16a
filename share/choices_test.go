package share

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmlb/llmlb"
)

// This replica's work is charged as the balancer charges it: a request of
// several completions (Request.Choices) decodes each of them.
func TestLocalTokensMatchBalancerWithChoices(t *testing.T) {
	clock := &fakeClock{t: at(0)}
	g := offline(t, Config{ID: "a", Clock: clock, DecodeAllowance: 300})
	b, err := llmlb.New(llmlb.RoundRobin(), llmlb.WithClock(clock), llmlb.WithDecodeAllowance(300), llmlb.WithObserver(g.Observer(nil)))
	require.NoError(t, err)
	require.NoError(t, b.Update([]llmlb.Endpoint{key("e1")}))
	for _, r := range []*llmlb.Request{
		{PromptTokens: 100, OutputTokens: 50, Choices: 4},
		{PromptTokens: 10, MaxTokens: 200, Choices: 3},
		{PromptTokens: 10, Choices: 2},
		{PromptTokens: 10, OutputTokens: 1 << 20, Choices: 1 << 16}, // charged at most 2^31-1
		{PromptTokens: 7, OutputTokens: 5},
	} {
		_, err := b.Pick(context.Background(), r)
		require.NoError(t, err)
		s, ok := b.StatsOf("e1")
		require.True(t, ok)
		_, _, tokens := g.local.totals("e1")
		require.Equal(t, s.PrefillTokens+s.DecodeTokens, tokens, "after a pick of %+v", *r)
	}
}
