package llmlb

import (
	"context"
	"errors"
	"math"
	"strconv"
	"testing"
	"time"
)

func TestConsistentHashBoundedLoad(t *testing.T) {
	for _, c := range []float64{1, 1.25, 2} {
		for _, n := range []int{3, 8, 13} {
			pol, err := ConsistentHash(HashConfig{Balance: c})
			if err != nil {
				t.Fatal(err)
			}
			b := mustNew(t, pol)
			mustUpdate(t, b, eps(n))
			var live []Pick
			// A skewed key distribution: a third of the keys are one hot key.
			for k := 0; k < 3000; k++ {
				key := "session-" + strconv.Itoa(k)
				if k%3 == 0 {
					key = "hot"
				}
				pk, err := b.Pick(context.Background(), &Request{AffinityKey: key})
				if err != nil {
					t.Fatal(err)
				}
				live = append(live, pk)
				m := k + 1
				limit := int64(math.Ceil(c * float64(m) / float64(n)))
				for _, s := range b.Stats() {
					if s.Outstanding > limit {
						t.Fatalf("c=%v n=%d after %d keys: %s holds %d > ceil(c*m/n) = %d", c, n, m, s.Key, s.Outstanding, limit)
					}
				}
			}
			for _, p := range live {
				p.Done(nil)
			}
		}
	}
}

func TestConsistentHashStickyAndMinimalMovement(t *testing.T) {
	assign := func(b *Balancer, keys int) map[string]string {
		out := map[string]string{}
		for k := 0; k < keys; k++ {
			key := "conversation-" + strconv.Itoa(k)
			pk, err := b.Pick(context.Background(), &Request{AffinityKey: key})
			if err != nil {
				t.Fatal(err)
			}
			out[key] = pk.Endpoint().Key()
			pk.Done(nil)
		}
		return out
	}
	for _, n := range []int{4, 10, 20} {
		pol, _ := ConsistentHash(HashConfig{})
		b := mustNew(t, pol)
		mustUpdate(t, b, eps(n))
		before := assign(b, 20000)
		again := assign(b, 20000)
		for k, v := range before {
			if again[k] != v {
				t.Fatalf("key %s moved from %s to %s without a membership change", k, v, again[k])
			}
		}
		mustUpdate(t, b, eps(n+1))
		after := assign(b, 20000)
		moved := 0
		for k, v := range before {
			if after[k] != v {
				moved++
				if after[k] != "ep"+strconv.Itoa(n) {
					t.Fatalf("key %s moved between old endpoints (%s -> %s)", k, v, after[k])
				}
			}
		}
		share := float64(moved) / float64(len(before))
		t.Logf("n=%d: %.3f of keys moved when one endpoint joined (ideal 1/(n+1) = %.3f)", n, share, 1/float64(n+1))
		if share > 2/float64(n+1) {
			t.Fatalf("n=%d: %.3f of keys moved, want at most 2/(n+1) = %.3f", n, share, 2/float64(n+1))
		}
	}
}

func TestConsistentHashNoKeyFallsBack(t *testing.T) {
	pol, _ := ConsistentHash(HashConfig{})
	b := mustNew(t, pol)
	mustUpdate(t, b, eps(4))
	seen := map[string]bool{}
	for range 200 {
		pk, _ := b.Pick(context.Background(), nil)
		seen[pk.Endpoint().Key()] = true
		pk.Done(nil)
	}
	if len(seen) != 4 {
		t.Fatalf("keyless requests reached %d of 4 endpoints", len(seen))
	}
	// Exclusion walks on to the next endpoint rather than failing.
	pk, _ := b.Pick(context.Background(), &Request{AffinityKey: "k"})
	home := pk.Endpoint().Key()
	pk.Done(nil)
	pk, err := b.Pick(context.Background(), &Request{AffinityKey: "k", Exclude: []string{home}})
	if err != nil || pk.Endpoint().Key() == home {
		t.Fatalf("excluded home %s: got %v, %v", home, pk.Endpoint(), err)
	}
	pk.Done(nil)
}

func TestPrefixHash(t *testing.T) {
	pol, err := PrefixHash(PrefixHashConfig{})
	if err != nil {
		t.Fatal(err)
	}
	b := mustNew(t, pol)
	mustUpdate(t, b, eps(8))
	prompt := func(group, tail int) []uint64 {
		p := make([]uint64, 40)
		for i := range p {
			p[i] = uint64(group*1000 + i)
			if i >= 16 { // past the first 256 tokens the prompts differ
				p[i] += uint64(tail) << 32
			}
		}
		return p
	}
	// Prompts sharing their first 256 tokens go to one endpoint while it is
	// not overloaded.
	home := ""
	for tail := range 5 {
		pk, _ := b.Pick(context.Background(), &Request{Prefix: prompt(1, tail)})
		if home == "" {
			home = pk.Endpoint().Key()
		}
		if pk.Endpoint().Key() != home {
			t.Fatalf("same 256-token head went to %s and %s", home, pk.Endpoint().Key())
		}
		pk.Done(nil)
	}
	// Overloaded owner: the load factor sends the request elsewhere.
	held := holdOn(t, b, home, 10, Request{})
	pk, _ := b.Pick(context.Background(), &Request{Prefix: prompt(1, 9)})
	if pk.Endpoint().Key() == home {
		t.Fatal("overloaded owner still took the request")
	}
	pk.Done(nil)
	for _, h := range held {
		h.Done(nil)
	}
	for _, bad := range []PrefixHashConfig{{PrefixTokens: -1}, {LoadFactor: 0.5}, {BlockTokens: -16}, {LoadFactor: math.NaN()}} {
		if _, err := PrefixHash(bad); !errors.Is(err, ErrInvalidPolicy) {
			t.Errorf("config %+v accepted", bad)
		}
	}
	for _, bad := range []HashConfig{{Balance: 0.9}, {Balance: math.NaN()}, {Replicas: -1}} {
		if _, err := ConsistentHash(bad); !errors.Is(err, ErrInvalidPolicy) {
			t.Errorf("config %+v accepted", bad)
		}
	}
}

// TestConsistentHashForwardsLearning checks that a balancer over
// ConsistentHash with a Default fallback learns speeds from the requests
// Default priced, and that a keyed request, which the ring placed without
// pricing its prefill, teaches no prefill observation.
func TestConsistentHashForwardsLearning(t *testing.T) {
	d, err := Default(DefaultConfig{})
	if err != nil {
		t.Fatal(err)
	}
	p, err := ConsistentHash(HashConfig{Fallback: d})
	if err != nil {
		t.Fatal(err)
	}
	clock := newFakeClock()
	b := mustNew(t, p, WithClock(clock))
	if !b.learn {
		t.Fatal("a balancer over ConsistentHash with a Default fallback does not learn")
	}
	mustUpdate(t, b, eps(1))
	est := b.snap.Load().eps[0].est
	if est == nil {
		t.Fatal("the balancer keeps no speed estimate")
	}
	observed := func() float64 {
		est.mu.Lock()
		defer est.mu.Unlock()
		return est.c
	}
	for _, r := range []Request{{PromptTokens: 1000, AffinityKey: "s1"}, {PromptTokens: 1000}} {
		pk, err := b.Pick(context.Background(), &r)
		if err != nil {
			t.Fatal(err)
		}
		clock.Advance(time.Second)
		pk.FirstToken()
		pk.Done(nil)
	}
	if c := observed(); c != 1 {
		t.Fatalf("%v prefill observations, want 1 (of the request without a key)", c)
	}
}

func TestRingReplicasBounded(t *testing.T) {
	for _, c := range []struct{ replicas, n, want int }{
		{160, 8, 160},
		{160, 0, 160},
		{1 << 16, 128, 1 << 16}, // exactly maxRingPoints
		{1 << 16, 129, maxRingPoints / 129},
		{1 << 16, 1000, maxRingPoints / 1000},
		{160, 100_000, maxRingPoints / 100_000},
		{1, 1 << 24, 1}, // one point each, however many
	} {
		got := ringReplicas(c.replicas, c.n)
		if got != c.want {
			t.Errorf("ringReplicas(%d, %d) = %d, want %d", c.replicas, c.n, got, c.want)
		}
		if c.n > 0 && c.n <= maxRingPoints && got*c.n > maxRingPoints {
			t.Errorf("ringReplicas(%d, %d): %d points in all", c.replicas, c.n, got*c.n)
		}
	}
}

// TestRingBoundedMembership builds a ring whose Replicas and membership
// would make 16.8M points: it has at most maxRingPoints, and keys still
// map to every endpoint.
func TestRingBoundedMembership(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a ring of 8M points")
	}
	pol, err := ConsistentHash(HashConfig{Replicas: 1 << 16})
	if err != nil {
		t.Fatal(err)
	}
	b := mustNew(t, pol)
	mustUpdate(t, b, eps(256))
	hit := map[string]bool{}
	for k := 0; k < 4000; k++ {
		pk, err := b.Pick(context.Background(), &Request{AffinityKey: "k" + strconv.Itoa(k)})
		if err != nil {
			t.Fatal(err)
		}
		hit[pk.Endpoint().Key()] = true
		pk.Done(nil)
	}
	r := pol.(*consistentHash).rings.cur.Load()
	if len(r.points) > maxRingPoints || len(r.points) != 256*(maxRingPoints/256) {
		t.Fatalf("ring of %d points, want %d", len(r.points), 256*(maxRingPoints/256))
	}
	if len(hit) < 250 {
		t.Fatalf("4000 keys reached %d of 256 endpoints", len(hit))
	}
}
