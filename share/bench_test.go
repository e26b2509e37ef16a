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

// BenchmarkBatch measures one batch from end to end: a replica builds it
// (Group.AppendBatch) and a peer applies it (Group.Receive), as every
// Interval for as long as both run. Between two batches the sender picks
// new requests and finishes its oldest, so that it keeps 32 requests in
// flight at each endpoint, each for 10 seconds (a streaming reply's
// lifetime). The bytes per batch are reported too.
func BenchmarkBatch(b *testing.B) {
	const (
		perEndpoint = 32
		lifetime    = 10 * time.Second
	)
	for _, eps := range []int{8, 64} {
		b.Run(fmt.Sprintf("endpoints=%d", eps), func(b *testing.B) {
			clock := &fakeClock{t: at(0)}
			a := offline(b, Config{ID: "a", Clock: clock})
			g := offline(b, Config{ID: "g", Clock: clock})
			o := a.Observer(nil)
			type flight struct {
				ep     llmlb.Endpoint
				picked time.Time
			}
			var inFlight []flight
			next := 0
			// Picks per Interval that keep perEndpoint requests in flight
			// at each endpoint for lifetime each.
			rate := eps * perEndpoint * int(DefaultInterval) / int(lifetime)
			step := func() {
				clock.Advance(DefaultInterval)
				for range rate {
					info := pickInfo("e"+strconv.Itoa(next%eps), 1000, 200)
					next++
					o.Pick(info)
					inFlight = append(inFlight, flight{info.Endpoint, clock.Now()})
				}
				for len(inFlight) > eps*perEndpoint {
					f := inFlight[0]
					inFlight = inFlight[1:]
					o.Done(llmlb.DoneInfo{Endpoint: f.ep, Latency: clock.Now().Sub(f.picked), Streamed: true})
				}
			}
			var buf []byte
			for range int(lifetime / DefaultInterval) { // fill the pipeline
				step()
				buf = a.AppendBatch(buf[:0])
			}
			b.ReportAllocs()
			for b.Loop() {
				step()
				buf = a.AppendBatch(buf[:0])
				if err := g.Receive(buf); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(len(buf)), "bytes/batch")
		})
	}
}
