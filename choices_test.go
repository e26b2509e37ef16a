package llmlb

import (
	"context"
	"errors"
	"math/rand/v2"
	"testing"
)

// A request of several completions (OpenAI's n) is charged the decode of
// each, on every path a pick takes, and releases all of it at Done.
func TestChoicesCharged(t *testing.T) {
	for _, pol := range []struct {
		name string
		p    func() Policy
	}{
		{"round-robin", RoundRobin}, // the fast path
		{"least-tokens", LeastTokens},
		{"default", func() Policy {
			p, err := Default(DefaultConfig{})
			if err != nil {
				t.Fatal(err)
			}
			return p
		}},
	} {
		t.Run(pol.name, func(t *testing.T) {
			b := mustNew(t, pol.p())
			mustUpdate(t, b, eps(1))
			for _, tc := range []struct {
				r    Request
				want int64
			}{
				{Request{PromptTokens: 10, MaxTokens: 100}, 100},
				{Request{PromptTokens: 10, MaxTokens: 100, Choices: 1}, 100},
				{Request{PromptTokens: 10, MaxTokens: 100, Choices: 4}, 400},
				{Request{PromptTokens: 10, OutputTokens: 50, Choices: 4}, 200},
				{Request{PromptTokens: 10, Choices: 3}, 3 * DefaultDecodeAllowance},
				{Request{PromptTokens: 10, MaxTokens: maxTokens, OutputTokens: maxTokens, Choices: maxChoices}, maxTokens},
			} {
				if got := decodeCharged(t, b, tc.r); got != tc.want {
					t.Errorf("%+v: charged %d, want %d", tc.r, got, tc.want)
				}
				if s := b.Stats()[0]; s.DecodeTokens != 0 || s.Outstanding != 0 {
					t.Fatalf("%+v: left %+v", tc.r, s)
				}
			}
		})
	}
}

// Choices out of range is an invalid request, refused before any charge.
func TestChoicesOutOfRange(t *testing.T) {
	b := mustNew(t, RoundRobin())
	mustUpdate(t, b, eps(2))
	for _, n := range []int{-1, maxChoices + 1} {
		_, err := b.Pick(context.Background(), &Request{Choices: n})
		if !errors.Is(err, ErrInvalidRequest) {
			t.Errorf("Choices %d: %v, want ErrInvalidRequest", n, err)
		}
	}
	for _, s := range b.Stats() {
		if s.Outstanding != 0 {
			t.Errorf("refused requests charged %+v", s)
		}
	}
}

// Output prediction learns one completion's length from a request of
// several, whose output counts them all, and charges a request of n
// completions n of them.
func TestChoicesOutputPrediction(t *testing.T) {
	b := mustNew(t, LeastOutstanding(), WithOutputPrediction(OutputConfig{}))
	mustUpdate(t, b, eps(1))
	r := rand.New(rand.NewPCG(3, 4))
	four := Request{PromptTokens: 100, Feature: "sample", Choices: 4}
	var sum float64
	for range 500 {
		n := 80 + r.IntN(41) // about 100 tokens each
		sum += float64(n)
		complete(t, b, four, 4*n)
	}
	mean := sum / 500
	one := float64(decodeCharged(t, b, Request{PromptTokens: 100, Feature: "sample"}))
	if one < 0.9*mean || one > 1.1*mean {
		t.Errorf("one completion charged %v, want about %v", one, mean)
	}
	if got := float64(decodeCharged(t, b, Request{PromptTokens: 100, Feature: "sample", Choices: 8})); got < 7.9*one || got > 8.1*one {
		t.Errorf("eight completions charged %v, want 8 x %v", got, one)
	}
}
