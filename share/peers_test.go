package share

import (
	"math/rand/v2"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/llmlb/llmlb"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// finPointsOfMessage converts the finished counts fin of a snapshot received at now
// to points by increasing time. A boundary of the ring without a count had
// none finished: a zero point goes beside each count whose neighbouring
// boundary lacks one, so that interpolation does not bridge the gap. The
// batch itself comes last: nothing had finished after it.
func finPointsOfMessage(m *message, fin []finCount, now int64) []finPoint {
	newest := now - m.phase // start of the newest bucket
	at := func(age int) int64 { return newest - int64(age)*m.width }
	pts := make([]finPoint, 0, 3*len(fin)+1)
	prev := m.horizon // age of the last count added; the ring has none older
	for j := len(fin) - 1; j >= 0; j-- {
		f := fin[j]
		if prev-1 > f.age+1 && prev < m.horizon {
			pts = append(pts, finPoint{at: at(prev - 1)})
		}
		if prev-1 > f.age {
			pts = append(pts, finPoint{at: at(f.age + 1)})
		}
		pts = append(pts, finPoint{at: at(f.age), n: f.n})
		prev = f.age
	}
	if prev > 0 {
		pts = append(pts, finPoint{at: at(prev - 1)})
	}
	switch last := &pts[len(pts)-1]; {
	case last.at >= now:
		last.n = 0
	case last.n != 0:
		pts = append(pts, finPoint{at: now})
	}
	return pts
}

// A peer's finished counts read as they did when their points were built
// on arrival (finPointsOfMessage): the same points, and the same
// interpolations between them, at any time.
func TestFinishedPointsOfKeptSnapshot(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for range 2000 {
		horizon := 1 + rng.IntN(12)
		width := int64(1 + rng.IntN(1000))
		m := &message{width: width, phase: rng.Int64N(width), horizon: horizon}
		var fin []finCount
		for age := range horizon {
			if rng.IntN(3) == 0 {
				fin = append(fin, finCount{age: age, n: int64(rng.IntN(4))})
			}
		}
		if len(fin) == 0 {
			continue
		}
		now := rng.Int64N(1e6) - 5e5
		m.eps = []epSnap{{key: "e", fin: fin}}
		var p peers
		s := p.build(m, now)
		ew := s.eps["e"]
		kept := s.fin[ew.f : ew.f+ew.nf]
		want := finPointsOfMessage(m, fin, now)
		var got []finPoint
		s.finPoints(kept, now, func(p finPoint) bool { got = append(got, p); return true })
		require.Equal(t, want, got, "%+v at %d", fin, now)
		lo, hi := want[0].at-2*width, want[len(want)-1].at+2*width
		for range 20 {
			at := lo + rng.Int64N(hi-lo+1)
			require.Equal(t, interpolate(want, at), s.finished(kept, now, at), "%+v at %d, interpolated at %d", fin, now, at)
		}
	}
}

// A peer's batches are applied without allocating once the receiver has
// seen their like: the decoded message, the endpoint keys and the kept
// snapshots reuse their memory.
func TestReceiveAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are meaningless under the race detector")
	}
	clock := &fakeClock{t: at(0)}
	g := offline(t, Config{ID: "self", Clock: clock})
	var peers []*Group
	for p := range 3 {
		peers = append(peers, offline(t, Config{ID: "peer-" + strconv.Itoa(p), Clock: clock}))
	}
	step := 0
	batches := func() [][]byte {
		var out [][]byte
		for _, a := range peers {
			o := a.Observer(nil)
			for i := range 8 {
				info := pickInfo("e"+strconv.Itoa(i), 100, 10)
				info.Request.Prefix = []uint64{uint64(step), uint64(i)}
				o.Pick(info)
				if i%2 == 0 {
					o.Done(llmlb.DoneInfo{Endpoint: info.Endpoint, Latency: 30 * time.Millisecond})
				}
			}
			out = append(out, a.AppendBatch(nil))
		}
		step++
		clock.Advance(DefaultInterval)
		return out
	}
	for range 50 {
		for _, b := range batches() {
			require.NoError(t, g.Receive(b))
		}
	}
	next := make([][][]byte, 0, 200)
	for range 200 {
		next = append(next, batches())
	}
	i := 0
	allocs := testing.AllocsPerRun(len(next)-1, func() {
		for _, b := range next[i] {
			if err := g.Receive(b); err != nil {
				t.Fatal(err)
			}
		}
		i++
	})
	assert.Zero(t, allocs)
}

// retainedBytes returns the bytes of the heap that stay in use after f.
func retainedBytes(f func()) int64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	f()
	runtime.GC()
	runtime.ReadMemStats(&after)
	return int64(after.HeapAlloc) - int64(before.HeapAlloc)
}

// What a Group keeps of a peer's batch is a few times its size at most,
// whatever its shape: many endpoints, many buckets, or finished counts
// with gaps between them.
func TestPeerMemoryIsAFewTimesItsBatch(t *testing.T) {
	const horizon = 1024
	many := func(ep func(i int) epSnap) *message {
		m := &message{id: "p", inc: 1, seq: 1, width: 1e6, horizon: horizon}
		for i := range maxWireEPs {
			m.eps = append(m.eps, ep(i))
		}
		return m
	}
	var gappy []finCount
	for age := 0; age < horizon; age += 3 {
		gappy = append(gappy, finCount{age: age, n: 1})
	}
	buckets := make([]bucket, horizon)
	for i := range buckets {
		buckets[i] = bucket{age: i, out: 1, tokens: 1}
	}
	cases := []struct {
		name string
		m    *message
	}{
		{"endpoints", many(func(i int) epSnap {
			return epSnap{key: strconv.Itoa(i), fin: []finCount{{age: 1, n: 1}}}
		})},
		{"buckets", many(func(i int) epSnap {
			if i >= 400 {
				return epSnap{key: "x" + strconv.Itoa(i)}
			}
			return epSnap{key: strconv.Itoa(i), buckets: buckets}
		})},
		{"finished counts with gaps", many(func(i int) epSnap {
			if i >= 1000 {
				return epSnap{key: "x" + strconv.Itoa(i)}
			}
			return epSnap{key: strconv.Itoa(i), fin: gappy}
		})},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b := appendMessage(nil, c.m)
			require.Less(t, len(b), maxMessageBytes)
			g := offline(t, Config{ID: "self"})
			kept := retainedBytes(func() { require.NoError(t, g.Receive(b)) })
			ratio := float64(kept) / float64(len(b))
			t.Logf("%d bytes kept of a batch of %d: %.1f times", kept, len(b), ratio)
			assert.Less(t, ratio, 12.0, "about ten times at most")
			runtime.KeepAlive(g)
		})
	}
}

// interpolate returns the requests in flight at t that have finished
// since, interpolating linearly between pts (ascending). Before the first
// point it is the first's count; after the last, the last's.
func interpolate(pts []finPoint, t int64) float64 {
	var l lerp
	l.t = t
	for _, p := range pts {
		if l.add(p) {
			break
		}
	}
	return l.value()
}
