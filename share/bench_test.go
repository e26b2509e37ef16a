package share

import (
	"fmt"
	"math"
	"strconv"
	"testing"
	"time"

	"github.com/llmlb/llmlb"
)

// BenchmarkLoad measures Group.Load, called for every candidate of every
// pick, with peers that each have requests in flight at every endpoint.
func BenchmarkLoad(b *testing.B) {
	for _, peers := range []int{1, 8, 64} {
		b.Run(fmt.Sprintf("peers=%d/endpoints=64", peers), func(b *testing.B) {
			clock := &fakeClock{t: at(0)}
			sig := &signalMap{}
			g := offline(b, Config{ID: "self", Clock: clock, Signal: sig})
			for p := range peers {
				a := offline(b, Config{ID: "peer-" + strconv.Itoa(p), Clock: clock})
				for i := range 64 {
					for range 4 {
						a.Observer(nil).Pick(pickInfo("e"+strconv.Itoa(i), 100, 10))
						clock.Advance(3 * time.Millisecond)
					}
				}
				transfer(a, g)
			}
			sig.Set("e7", llmlb.Load{At: at(300), Running: 3, KVUsage: math.NaN()})
			b.ReportAllocs()
			for b.Loop() {
				g.Load("e7")
			}
		})
	}
}

// BenchmarkObserver measures the observer's functions of one request.
func BenchmarkObserver(b *testing.B) {
	g := offline(b, Config{ID: "self"})
	o := g.Observer(nil)
	info := pickInfo("e1", 100, 10)
	info.Request.Prefix = []uint64{1, 2, 3, 4}
	b.ReportAllocs()
	for b.Loop() {
		o.Pick(info)
		o.FirstToken(llmlb.FirstTokenInfo{Endpoint: info.Endpoint})
		o.Done(llmlb.DoneInfo{Endpoint: info.Endpoint, Streamed: true})
	}
}
