package prefix

import (
	"maps"
	"math/bits"
	"math/rand/v2"
	"testing"
	"time"
)

// checkMinExp verifies that every holder entry's minExp is at most the
// expiry of each endpoint it lists, which Match relies on to skip the
// endpoints' own expiries.
func checkMinExp(t *testing.T, x *Index) {
	t.Helper()
	x.mu.RLock()
	defer x.mu.RUnlock()
	x.holders.all(func(h uint64, w int, hd holder) {
		for b := hd.bits; b != 0; b &= b - 1 {
			i := bits.TrailingZeros64(b)
			exp, _ := x.slots[64*w+i].lru.Peek(h)
			if exp < hd.minExp {
				t.Fatalf("holder %x minExp %d > expiry %d of slot %d", h, hd.minExp, exp, 64*w+i)
			}
		}
	})
}

// TestIndexArbitraryBlocks compares the index with the model on block lists
// that are not prompt chains (any order, repeated blocks), over one and more
// groups of 64 endpoints near MaxEndpoints, with times that step exactly
// onto expiry and slack boundaries and sometimes go back. Matches are
// compared at times no earlier than every preceding call's, where the index
// documents them exact.
func TestIndexArbitraryBlocks(t *testing.T) {
	for seed := uint64(0); seed < 200; seed++ {
		r := rand.New(rand.NewPCG(seed, 3))
		cfg := IndexConfig{BlockSize: 16, Capacity: 1 + r.IntN(8), TTL: time.Duration(64+r.IntN(200)) * time.Millisecond, MaxEndpoints: 1 + r.IntN(140)}
		x, err := NewIndex(cfg)
		if err != nil {
			t.Fatal(err)
		}
		m := newModel(cfg)
		now := time.Unix(1000, 0)
		maxNow := now
		// A Record at a time earlier than a preceding one's may leave
		// expiries the model does not (see Index); the states are compared
		// until the first step back.
		wentBack := false
		for op := 0; op < 400; op++ {
			ep := epName(r.IntN(cfg.MaxEndpoints + 3))
			blocks := make([]uint64, r.IntN(10))
			for i := range blocks {
				blocks[i] = uint64(1 + r.IntN(12))
			}
			switch r.IntN(10) {
			case 0, 1, 2:
				err := x.Record(ep, blocks, now)
				if ok := m.record(ep, blocks, now.UnixNano()); ok != (err == nil) {
					t.Fatalf("seed %d op %d: Record(%s) = %v, model ok %v", seed, op, ep, err, ok)
				}
			case 3:
				err := x.Stored(ep, 16, blocks...)
				if ok := m.stored(ep, 16, blocks); ok != (err == nil) {
					t.Fatalf("seed %d op %d: Stored(%s) = %v, model ok %v", seed, op, ep, err, ok)
				}
			case 4:
				if err := x.Removed(ep, 16, blocks...); err != nil {
					t.Fatal(err)
				}
				m.removed(ep, 16, blocks)
			case 5:
				c := 1 + r.IntN(9)
				err := x.SetCapacity(ep, c)
				if ok := m.setCapacity(ep, c); ok != (err == nil) {
					t.Fatalf("seed %d op %d: SetCapacity(%s) = %v, model ok %v", seed, op, ep, err, ok)
				}
			case 6:
				if r.IntN(4) == 0 {
					x.RemoveEndpoint(ep)
					delete(m.eps, ep)
				} else {
					x.Cleared(ep)
					if e := m.eps[ep]; e != nil {
						e.list = nil
					}
				}
			case 7, 8:
				if now.Before(maxNow) {
					break
				}
				got := asMap(t, x.Match(blocks, now, nil))
				want := m.match(blocks, now.UnixNano())
				if !maps.Equal(got, want) {
					t.Fatalf("seed %d op %d: Match(%v) = %v, want %v", seed, op, blocks, got, want)
				}
				if got, want := x.MatchLen(ep, blocks, now), m.matchLen(ep, blocks, now.UnixNano()); got != want {
					t.Fatalf("MatchLen = %d want %d", got, want)
				}
			case 9:
				steps := []time.Duration{0, 1, cfg.TTL / 64, cfg.TTL/64 - 1, cfg.TTL, cfg.TTL - 1, cfg.TTL / 3}
				d := steps[r.IntN(len(steps))]
				if r.IntN(3) == 0 && d > 0 {
					d = -d
					wentBack = true
				}
				now = now.Add(d)
				if now.After(maxNow) {
					maxNow = now
				}
			}
			checkInvariants(t, x)
			checkMinExp(t, x)
			if raceEnabled && op%4 != 0 {
				continue // the race detector finds nothing more in every op
			}
			if !wentBack {
				checkModel(t, x, m)
			}
			checkListed(t, x, maxNow.UnixNano())
		}
	}
}
