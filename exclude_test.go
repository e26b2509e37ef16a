package llmlb

import (
	"context"
	"errors"
	"math/rand/v2"
	"strconv"
	"testing"
)

// TestExcludeLists picks with Exclude lists short and long (longer lists
// are looked up per key, shorter ones scanned per member), holding
// duplicates and keys of no member, on pools with unhealthy members: a
// pick never goes to an excluded endpoint, prefers healthy candidates,
// falls back to unhealthy ones (panic mode) only when no healthy one is
// left, and fails with ErrNoCandidates only when every member is excluded.
func TestExcludeLists(t *testing.T) {
	ctx := context.Background()
	r := rand.New(rand.NewPCG(7, 8))
	for _, pol := range benchPolicies {
		t.Run(pol.name, func(t *testing.T) {
			const n = 40
			b, err := New(pol.new())
			if err != nil {
				t.Fatal(err)
			}
			if err := b.Update(eps(n)); err != nil {
				t.Fatal(err)
			}
			sick := map[string]bool{}
			for i := range n {
				if r.IntN(4) == 0 {
					key := "ep" + strconv.Itoa(i)
					sick[key] = true
					if err := b.SetHealthy(key, false); err != nil {
						t.Fatal(err)
					}
				}
			}
			for round := range 300 {
				var exclude []string
				out := map[string]bool{}
				switch round % 3 {
				case 0:
					exclude = make([]string, r.IntN(maxScannedExcludes+1))
				case 1:
					exclude = make([]string, maxScannedExcludes+1+r.IntN(3*n))
				default:
					exclude = make([]string, n) // every member, perhaps
				}
				for j := range exclude {
					i := r.IntN(n + 4) // some keys of no member
					if round%3 == 2 && j < n {
						i = j
					}
					exclude[j] = "ep" + strconv.Itoa(i)
					out[exclude[j]] = true
				}
				healthyLeft, left := false, false
				for i := range n {
					key := "ep" + strconv.Itoa(i)
					if !out[key] {
						left = true
						healthyLeft = healthyLeft || !sick[key]
					}
				}
				pk, err := b.Pick(ctx, &Request{PromptTokens: 100, Exclude: exclude})
				if !left {
					if !errors.Is(err, ErrNoCandidates) {
						t.Fatalf("round %d: every member excluded (%d keys): %v, want ErrNoCandidates", round, len(exclude), err)
					}
					continue
				}
				if err != nil {
					t.Fatalf("round %d: %d keys excluded: %v", round, len(exclude), err)
				}
				key := pk.Endpoint().Key()
				pk.Done(nil)
				if out[key] {
					t.Fatalf("round %d: picked %s, which the request excludes (%d keys)", round, key, len(exclude))
				}
				if healthyLeft && sick[key] {
					t.Fatalf("round %d: picked unhealthy %s while a healthy candidate was left", round, key)
				}
			}
		})
	}
}

// TestLongExcludeAllocs: a pick excluding many endpoints allocates nothing
// once its scratch space has grown.
func TestLongExcludeAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector makes sync.Pool drop items, so pooled scratch space is allocated again")
	}
	b, err := New(P2C(nil))
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Update(eps(256)); err != nil {
		t.Fatal(err)
	}
	exclude := make([]string, 200)
	for i := range exclude {
		exclude[i] = "ep" + strconv.Itoa(i)
	}
	req := &Request{PromptTokens: 100, Exclude: exclude}
	ctx := context.Background()
	allocs := testing.AllocsPerRun(1000, func() {
		pk, err := b.Pick(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		pk.Done(nil)
	})
	if allocs != 0 {
		t.Errorf("%v allocs per Pick+Done excluding 200 of 256 endpoints, want 0", allocs)
	}
}
