package llmlb

import (
	"context"
	"math"
	"testing"
)

// TestGIEQueueScoreOfHugeQueue checks that an engine reporting the largest
// queue an int holds scores the worst queue, not better than an idle one:
// the queue score must not pass the count through a float64 and back.
func TestGIEQueueScoreOfHugeQueue(t *testing.T) {
	clock := newFakeClock()
	sig := &fakeSignal{}
	pol, err := GIEDefault(GIEConfig{QueueWeight: 1})
	if err != nil {
		t.Fatal(err)
	}
	b := mustNew(t, pol, WithClock(clock), WithSignal(sig, 0))
	mustUpdate(t, b, eps(2))
	sig.Set("ep0", Load{At: clock.Now(), Waiting: math.MaxInt, KVUsage: math.NaN()})
	sig.Set("ep1", Load{At: clock.Now(), Waiting: 0, KVUsage: math.NaN()})
	for range 20 {
		pk, err := b.Pick(context.Background(), &Request{PromptTokens: 100})
		if err != nil {
			t.Fatal(err)
		}
		if k := pk.Endpoint().Key(); k != "ep1" {
			t.Fatalf("picked %s, whose engine queues %d requests, over an idle ep1", k, math.MaxInt)
		}
		pk.Done(nil)
	}
}
