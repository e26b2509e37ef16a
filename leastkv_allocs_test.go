package llmlb

import (
	"context"
	"math"
	"strconv"
	"testing"
	"time"
)

// Pricing the endpoints without a KV usage at the candidates' mean does not
// allocate.
func TestKVScoreMeanDoesNotAllocate(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector makes sync.Pool drop items; allocation counts are meaningless")
	}
	sig := &fakeSignal{}
	for i := range 64 {
		switch i % 3 {
		case 0: // fresh, with a KV usage
			sig.Set("ep"+strconv.Itoa(i), Load{At: time.Now(), Running: 3, Waiting: 1, KVUsage: 0.5})
		case 1: // fresh, without one
			sig.Set("ep"+strconv.Itoa(i), Load{At: time.Now(), Running: 3, Waiting: 1, KVUsage: math.NaN()})
		}
	}
	ctx := context.Background()
	req := &Request{PromptTokens: 1000, MaxTokens: 256}
	for _, pol := range []struct {
		name string
		p    Policy
	}{{"least-kv", LeastKV()}, {"p2c-kv", P2C(KVScore)}} {
		b, err := New(pol.p, WithSignal(sig, time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		_ = b.Update(eps(64))
		if allocs := testing.AllocsPerRun(1000, func() {
			p, err := b.Pick(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			p.FirstToken()
			p.Done(nil)
		}); allocs != 0 {
			t.Errorf("%s: %v allocs per Pick+FirstToken+Done, want 0", pol.name, allocs)
		}
	}
}
