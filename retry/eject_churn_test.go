package retry

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/llmlb/llmlb"
)

// update replaces the membership of b with keys.
func update(t testing.TB, b *llmlb.Balancer, keys ...string) {
	t.Helper()
	eps := make([]llmlb.Endpoint, len(keys))
	for i, k := range keys {
		eps[i] = ep(k)
	}
	if err := b.Update(eps); err != nil {
		t.Fatal(err)
	}
}

// tracked returns how many endpoints e keeps state for.
func tracked(e *Ejector) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.eps)
}

// TestEjectorChurn: endpoints that fail a few times and leave the pool must
// not stop the ejector from tracking the members that remain.
func TestEjectorChurn(t *testing.T) {
	clk := newFakeClock()
	members := keys(10)
	b := newBalancer(t, members...)
	e, _ := NewEjector(b, EjectorConfig{Clock: clk})
	fail := &StatusError{Code: 502}
	const batches, size = 21, 1000
	for i := range batches {
		gone := make([]string, size)
		for j := range gone {
			gone[j] = fmt.Sprintf("gone-%d-%d", i, j)
		}
		update(t, b, append(slices.Clone(members), gone...)...)
		for _, k := range gone {
			for range 3 {
				e.Report(k, fail)
			}
		}
		update(t, b, members...)
		clk.Advance(time.Second)
	}
	if n := tracked(e); n > maxTracked {
		t.Errorf("%d endpoints tracked after %d departed, bound %d", n, batches*size, maxTracked)
	}
	for range 50 {
		e.Report("e0", fail)
	}
	if healthy(b, "e0") || !slices.Equal(e.Ejected(), []string{"e0"}) {
		t.Fatalf("member failing 50 times after churn not ejected: ejected %v", e.Ejected())
	}
}

// TestEjectorCapAfterChurn: after many endpoints were ejected and left the
// pool, the cap counts only the members: 10% of them, and at least one.
func TestEjectorCapAfterChurn(t *testing.T) {
	cases := []struct {
		name    string
		members int
		want    int
	}{
		{"10%", 20, 2},
		{"at least one", 3, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			clk := newFakeClock()
			members := keys(tc.members)
			b := newBalancer(t, members...)
			e, _ := NewEjector(b, EjectorConfig{Clock: clk})
			fail := errors.New("connection reset")
			const batches, size = 200, 100
			departedEjected := 0
			for i := range batches {
				gone := make([]string, size)
				for j := range gone {
					gone[j] = fmt.Sprintf("gone-%d-%d", i, j)
				}
				update(t, b, append(slices.Clone(members), gone...)...)
				for _, k := range gone {
					for range 5 {
						e.Report(k, fail)
					}
				}
				departedEjected += len(e.Ejected())
				update(t, b, members...)
				clk.Advance(time.Second)
			}
			if departedEjected == 0 {
				t.Fatal("no departing endpoint was ejected")
			}
			for _, k := range members {
				for range 5 {
					e.Report(k, fail)
				}
			}
			got := e.Ejected()
			if want := members[:tc.want]; !slices.Equal(got, want) {
				t.Fatalf("ejected %v of %d members after churn, want %v", got, tc.members, want)
			}
			for _, k := range members {
				if healthy(b, k) == slices.Contains(got, k) {
					t.Errorf("%s: balancer health disagrees with the ejector", k)
				}
			}
		})
	}
}

// countingHealth counts the endpoint stats its Health copies.
type countingHealth struct {
	Health
	calls, rows int
}

func (h *countingHealth) Stats() []llmlb.EndpointStats {
	s := h.Health.Stats()
	h.calls++
	h.rows += len(s)
	return s
}

// TestEjectorReportWork: ejection decisions on a large pool do not copy
// every endpoint's stats each time; with the clock standing still the
// membership is read once.
func TestEjectorReportWork(t *testing.T) {
	const n, reports = 20000, 100000
	clk := newFakeClock()
	ks := keys(n)
	h := &countingHealth{Health: newBalancer(t, ks...)}
	e, _ := NewEjector(h, EjectorConfig{Clock: clk, ConsecutiveFailures: 1})
	fail := errors.New("connection reset")
	for i := range reports {
		e.Report(ks[i%n], fail)
		if h.rows > n {
			t.Fatalf("after %d reports, %d calls of Stats copied %d rows; want at most one read of %d",
				i+1, h.calls, h.rows, n)
		}
	}
	if got := len(e.Ejected()); got != n/10 {
		t.Fatalf("%d ejected, want %d", got, n/10)
	}
	// As the clock moves, the membership is read at most once a second.
	h.calls = 0
	for i := range n {
		clk.Advance(time.Millisecond)
		e.Report(ks[i], fail)
	}
	if limit := n/1000 + 1; h.calls > limit {
		t.Fatalf("%d reads of the membership in %d s", h.calls, n/1000)
	}
}

// TestEjectorInvariants runs random reports, membership changes and clock
// moves, and checks after each step that the ejector's state is consistent
// with itself and with the balancer, and that an ejection never takes the
// ejected count above the cap of the current membership.
func TestEjectorInvariants(t *testing.T) {
	for seed := range uint64(20) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 7))
			clk := newFakeClock()
			universe := keys(64)
			member := map[string]bool{}
			var members []string
			setMembers := func() {
				members = members[:0]
				for _, k := range universe {
					if member[k] {
						members = append(members, k)
					}
				}
				slices.Sort(members)
			}
			for _, k := range universe {
				member[k] = rng.IntN(2) == 0
			}
			setMembers()
			b := newBalancer(t, members...)
			percent := []float64{10, 25, 50, 100}[rng.IntN(4)]
			e, _ := NewEjector(b, EjectorConfig{
				Clock:               clk,
				ConsecutiveFailures: 1 + rng.IntN(3),
				MaxEjectionPercent:  percent,
			})
			setLimit(e, 16)
			errs := []error{
				errors.New("connection reset"), &StatusError{Code: 502},
				nil, &StatusError{Code: 404},
				&StatusError{Code: 429},
				&StatusError{Code: 429, Header: http.Header{"Retry-After": {"3"}}},
			}
			for step := range 2000 {
				before := len(e.Ejected())
				op := rng.IntN(100)
				switch {
				case op < 75:
					k := universe[rng.IntN(len(universe))]
					if len(members) > 0 && rng.IntN(4) > 0 {
						k = members[rng.IntN(len(members))]
					}
					e.Report(k, errs[rng.IntN(len(errs))])
				case op < 85:
					clk.Advance(time.Duration(rng.Int64N(int64(40 * time.Second))))
				case op < 95:
					for range 1 + rng.IntN(4) {
						k := universe[rng.IntN(len(universe))]
						member[k] = !member[k]
					}
					setMembers()
					update(t, b, members...)
					// The ejector reads the membership at most once a second.
					clk.Advance(membersTTL)
				default:
					e.Sweep()
				}
				checkEjector(t, e)
				got, cooling := e.Ejected(), e.Cooling()
				for _, s := range b.Stats() {
					if !s.Healthy && !slices.Contains(got, s.Key) && !slices.Contains(cooling, s.Key) {
						t.Fatalf("step %d: %s unhealthy in the balancer but neither ejected nor cooling (%v, %v)", step, s.Key, got, cooling)
					}
				}
				if len(got) > before {
					for _, k := range got {
						if !member[k] {
							t.Fatalf("step %d: ejected %v after a new ejection; %s is not a member", step, got, k)
						}
					}
					if limit := max(1, int(percent*float64(len(members))/100)); len(got) > limit {
						t.Fatalf("step %d: %d ejected of %d members, cap %d", step, len(got), len(members), limit)
					}
				}
			}
		})
	}
}
