package share

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func sampleMessage() *message {
	return &message{
		id: "replica-a", inc: 0xfeedface, seq: 42,
		width: 100e6, phase: 37e6, horizon: 101,
		eps: []epSnap{
			{key: "http://10.0.0.7:8000", buckets: []bucket{{age: 0, out: 3, queued: 2, tokens: 4100, prefill: 3800}, {age: 4, out: 1, queued: 0, tokens: 256}, {age: 101, out: 7, queued: 0, tokens: 1800}}},
			{key: "http://10.0.0.8:8000"},
		},
		routes: []route{{ep: 1, blocks: []uint64{1, 2, 3}}, {ep: 0, blocks: []uint64{^uint64(0)}}},
	}
}

func TestWireRoundTrip(t *testing.T) {
	m := sampleMessage()
	b := appendMessage(nil, m)
	got, err := decode(b)
	require.NoError(t, err)
	assert.Equal(t, m, got)
	assert.Less(t, len(b), 160, "compact: %d bytes", len(b))
}

// A receiver decodes every batch into the same message: what one batch
// left there (buckets, finished counts, routes, endpoints) must not show in
// the next.
func TestDecodeIntoReuses(t *testing.T) {
	full := sampleMessage()
	full.eps[1].fin = []finCount{{age: 2, n: 5}}
	full.eps = append(full.eps, epSnap{key: "http://10.0.0.9:8000", buckets: []bucket{{age: 1, out: 1, tokens: 10, prefill: 4}}})
	smaller := &message{id: "replica-b", inc: 1, seq: 1, width: 100e6, horizon: 101,
		eps:    []epSnap{{key: "http://10.0.0.8:8000"}, {key: "http://10.0.0.7:8000", buckets: []bucket{{age: 3, out: 2, queued: 1, tokens: 20, prefill: 5}}}},
		routes: []route{{ep: 0, blocks: []uint64{9}}},
	}
	var m message
	seen := &keyTable{}
	for _, want := range []*message{full, smaller, full, {id: "c", width: 1, horizon: 1}, smaller} {
		b := appendMessage(nil, want)
		require.NoError(t, decodeInto(&m, seen, b))
		assert.Equal(t, b, appendMessage(nil, &m), "decoded into a reused message after another")
	}
	// A refused batch leaves nothing that the next one shows.
	require.Error(t, decodeInto(&m, seen, []byte{wireVersion, 0xff}))
	b := appendMessage(nil, smaller)
	require.NoError(t, decodeInto(&m, seen, b))
	assert.Equal(t, b, appendMessage(nil, &m))
}

// A version 1 sender's message, from before buckets carried their queued
// prefill, is read with that prefill unknown.
func TestWireReadsVersion1(t *testing.T) {
	got, err := decode(version1Message())
	require.NoError(t, err)
	want := &message{id: "a", inc: 7, seq: 3, width: 100e6, phase: 5, horizon: 10,
		eps: []epSnap{{key: "e1", buckets: []bucket{{age: 0, out: 2, queued: 1, tokens: 300, prefill: -1}}}}}
	assert.Equal(t, want, got)
}

// version1Message returns a message of sender "a" in version 1: two
// requests in flight at e1, one queued, 300 tokens of work.
func version1Message() []byte {
	b := []byte{1, 1, 'a'}
	b = binary.LittleEndian.AppendUint64(b, 7)
	for _, v := range []uint64{
		3, 100e6, 5, 10, // sequence, width, phase, horizon
		1, 2, 'e', '1', // one endpoint, "e1"
		1, 0, 2, 1, 300, // one bucket: age 0, 2 out, 1 queued, 300 tokens
		0, 0, // no finished counts, no routes
	} {
		b = binary.AppendUvarint(b, v)
	}
	return b
}

func TestWireRejects(t *testing.T) {
	valid := appendMessage(nil, sampleMessage())
	mutate := func(f func(m *message)) []byte {
		m := sampleMessage()
		f(m)
		return appendMessage(nil, m)
	}
	cases := []struct {
		name string
		in   []byte
	}{
		{"empty", nil},
		{"version 0", append([]byte{0}, valid[1:]...)},
		{"version 3", append([]byte{3}, valid[1:]...)},
		{"truncated", valid[:len(valid)-1]},
		{"trailing", append(bytes.Clone(valid), 0)},
		{"empty id", mutate(func(m *message) { m.id = "" })},
		{"zero width", mutate(func(m *message) { m.width = 0 })},
		{"width too large", mutate(func(m *message) { m.width = 2 * maxWidth })},
		{"phase beyond width", mutate(func(m *message) { m.phase = m.width })},
		{"zero horizon", mutate(func(m *message) { m.horizon = 0; m.eps[0].buckets = nil })},
		{"horizon too large", mutate(func(m *message) { m.horizon = maxHorizon + 1 })},
		{"empty key", mutate(func(m *message) { m.eps[1].key = "" })},
		{"duplicate key", mutate(func(m *message) { m.eps[1].key = m.eps[0].key })},
		{"ages not increasing", mutate(func(m *message) { m.eps[0].buckets[1].age = 0 })},
		{"age beyond horizon", mutate(func(m *message) { m.eps[0].buckets[2].age = 102 })},
		{"queued above outstanding", mutate(func(m *message) { m.eps[0].buckets[0].queued = 4 })},
		{"count too large", mutate(func(m *message) { m.eps[0].buckets[0].out = maxCount + 1 })},
		{"prefill above tokens", mutate(func(m *message) { m.eps[0].buckets[0].prefill = 4101 })},
		{"route endpoint", mutate(func(m *message) { m.routes[0].ep = 2 })},
		{"route without blocks", mutate(func(m *message) { m.routes[0].blocks = nil })},
		{"route without endpoints", mutate(func(m *message) { m.eps = nil; m.routes = m.routes[1:]; m.routes[0].ep = 0 })},
		{"endpoints beyond the input", withCounts(1000)},
		{"endpoints beyond the limit", withCounts(maxWireEPs + 1)},
		{"oversized", make([]byte, maxMessageBytes+1)},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := decode(c.in)
			require.Error(t, err)
			assert.True(t, errors.Is(err, ErrMalformed), "%v", err)
		})
	}
}

// withCounts returns a header announcing n endpoints and nothing after.
func withCounts(n uint64) []byte {
	b := appendMessage(nil, &message{id: "x", width: 1, horizon: 1})
	return binary.AppendUvarint(b[:len(b)-2], n)
}

// FuzzDecode checks that decode never panics, allocates in proportion to
// its input, and that whatever it accepts encodes back to the same bytes.
func FuzzDecode(f *testing.F) {
	f.Add(appendMessage(nil, sampleMessage()))
	f.Add(appendMessage(nil, &message{id: "x", width: 1, horizon: 1}))
	f.Add(version1Message())
	f.Add([]byte{1})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decode(b)
		// Decoding into a message another batch was decoded into, as a
		// receiver does, gives the same result.
		var reused message
		seen := &keyTable{}
		require.NoError(t, decodeInto(&reused, seen, appendMessage(nil, sampleMessage())))
		errReused := decodeInto(&reused, seen, b)
		if err != nil {
			if m != nil {
				t.Fatal("message with an error")
			}
			if errReused == nil {
				t.Fatal("a reused message accepts what a new one refuses")
			}
			return
		}
		if errReused != nil {
			t.Fatalf("a reused message refuses what a new one accepts: %v", errReused)
		}
		// Its sender reads alone as in the whole message.
		if id, inc, ok := decodeSender(b); !ok || string(id) != m.id || inc != m.inc {
			t.Fatalf("sender %q %x (%v), message's %q %x", id, inc, ok, m.id, m.inc)
		}
		if !bytes.Equal(appendMessage(nil, &reused), appendMessage(nil, m)) {
			t.Fatal("a reused message decodes differently")
		}
		if b[0] == 1 {
			// Read as version 1 and written as the current version.
			for _, e := range m.eps {
				for _, bk := range e.buckets {
					if bk.prefill != -1 {
						t.Fatalf("version 1 bucket with prefill %d", bk.prefill)
					}
				}
			}
			return
		}
		if again := appendMessage(nil, m); !bytes.Equal(again, b) {
			// Varints have one canonical form each; a longer one that
			// decodes to the same value is the only allowed difference.
			m2, err := decode(again)
			if err != nil {
				t.Fatalf("re-encoding does not decode: %v", err)
			}
			if len(again) > len(b) || m2.seq != m.seq || len(m2.eps) != len(m.eps) || len(m2.routes) != len(m.routes) {
				t.Fatalf("re-encoding differs: %x vs %x", again, b)
			}
		}
		blocks := 0
		for _, r := range m.routes {
			blocks += len(r.blocks)
		}
		if blocks > maxWireBlocks || len(m.eps) > maxWireEPs {
			t.Fatalf("limits exceeded: %d blocks, %d endpoints", blocks, len(m.eps))
		}
	})
}

// A Group keeps the decoded memory of a small batch for the next one, and
// releases that of a large one.
func TestReceiveReleasesLargeBatches(t *testing.T) {
	g := offline(t, Config{ID: "self"})
	batch := func(seq uint64, blocks int) []byte {
		m := &message{id: "peer", inc: 1, seq: seq, width: 100e6, horizon: 10,
			eps:    []epSnap{{key: "e1", buckets: []bucket{{age: 0, out: 1, tokens: 10}}}},
			routes: []route{{ep: 0, blocks: make([]uint64, blocks)}}}
		for i := range m.routes[0].blocks {
			m.routes[0].blocks[i] = uint64(i + 1)
		}
		return appendMessage(nil, m)
	}
	small := batch(1, 4)
	require.NoError(t, g.Receive(small))
	assert.NotZero(t, cap(g.recv.routes), "a small batch's memory is kept")
	large := batch(2, keepDecoded/8+1)
	require.Greater(t, len(large), keepDecoded)
	require.NoError(t, g.Receive(large))
	assert.Zero(t, cap(g.recv.routes), "a large batch's memory is released")
	assert.Nil(t, g.keys.known)
	require.NoError(t, g.Receive(batch(3, 4)))
	assert.Equal(t, uint64(3), g.Stats().Received)
}

// keptDecoded returns the memory held by the slices of m, as decodeInto
// leaves them for the next message: those beyond the message's routes and
// endpoints too.
func keptDecoded(m *message) int {
	n := cap(m.routes)*int(unsafe.Sizeof(route{})) + cap(m.eps)*int(unsafe.Sizeof(epSnap{}))
	for _, r := range m.routes[:cap(m.routes)] {
		n += 8 * cap(r.blocks)
	}
	for _, e := range m.eps[:cap(m.eps)] {
		n += cap(e.buckets)*int(unsafe.Sizeof(bucket{})) + cap(e.fin)*int(unsafe.Sizeof(finCount{}))
	}
	return n
}

// A peer cannot make a receiver keep ever more memory with batches each
// small enough to be kept: batch k has k routes of one block and then one
// long route, so that each grows the blocks of a route slot no batch
// before used, nor (k endpoints with long bucket lists) an endpoint slot's.
// Refused batches (a sequence number replayed) decode first and count
// alike.
func TestReceiveBoundsKeptMemory(t *testing.T) {
	for _, tc := range []struct {
		name string
		msg  func(k int) *message
	}{
		{"route slots", func(k int) *message {
			m := &message{id: "peer", inc: 1, seq: uint64(k + 1), width: 1e8, horizon: 1, eps: []epSnap{{key: "e"}}}
			for i := range k {
				m.routes = append(m.routes, route{blocks: []uint64{uint64(i)}})
			}
			return append1(m, route{blocks: make([]uint64, (250<<10-10*k-64)/8)})
		}},
		{"endpoint slots", func(k int) *message {
			m := &message{id: "peer", inc: 1, seq: uint64(k%maxEPsTest + 1), width: 1e8, horizon: 255}
			for i := range k % maxEPsTest {
				m.eps = append(m.eps, epSnap{key: fmt.Sprint("e", i)})
			}
			long := epSnap{key: "long"}
			for age := range 256 {
				long.buckets = append(long.buckets, bucket{age: age, out: 1, queued: 1, tokens: 1, prefill: 1})
			}
			m.eps = append(m.eps, long)
			return m
		}},
		{"replayed", func(k int) *message {
			m := &message{id: "peer", inc: 1, seq: 1, width: 1e8, horizon: 1, eps: []epSnap{{key: "e"}}}
			for i := range k {
				m.routes = append(m.routes, route{blocks: []uint64{uint64(i)}})
			}
			return append1(m, route{blocks: make([]uint64, (250<<10-10*k-64)/8)})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := offline(t, Config{ID: "self"})
			most := 0
			for k := range 600 {
				data := appendMessage(nil, tc.msg(k))
				require.LessOrEqual(t, len(data), keepDecoded)
				if err := g.Receive(data); tc.name == "replayed" && k > 0 {
					require.ErrorIs(t, err, ErrRefused, "batch %d", k)
				} else {
					require.NoError(t, err, "batch %d", k)
				}
				most = max(most, keptDecoded(&g.recv))
				require.LessOrEqual(t, keptDecoded(&g.recv), 2*maxKeptDecoded, "after batch %d", k)
			}
			t.Logf("at most %d KiB kept", most>>10)
		})
	}
}

// maxEPsTest is the endpoints of TestReceiveBoundsKeptMemory's batches, at
// most: under Config.MaxEndpoints.
const maxEPsTest = 1000

func append1(m *message, r route) *message {
	m.routes = append(m.routes, r)
	return m
}

// The decoder's inlined reading of short varints agrees with its general
// one on every varint of up to two bytes, whatever the limit.
func TestSmallVarintsReadAsAnyVarint(t *testing.T) {
	for _, in := range [][]byte{{5}, {0x85, 1}, {0xff, 0x7f}} {
		d := decoder{b: in}
		_, ok := d.small(maxCount)
		require.True(t, ok, "% x read inline", in)
	}
	for _, limit := range []uint64{0, 1, 127, 128, 200, 1<<14 - 1, 1 << 14, maxCount} {
		for b0 := range 256 {
			for b1 := range 256 {
				for _, in := range [][]byte{{byte(b0)}, {byte(b0), byte(b1)}, {byte(b0), byte(b1), 1}} {
					fast := decoder{b: in}
					v, ok := fast.small(limit)
					if !ok {
						if fast.off != 0 {
							t.Fatalf("% x: read %d bytes and failed", in, fast.off)
						}
						continue
					}
					slow := decoder{b: in}
					if w := slow.uint("v", limit); slow.err != nil || w != v || slow.off != fast.off {
						t.Fatalf("% x, limit %d: small reads %d in %d bytes, uint %d in %d (%v)", in, limit, v, fast.off, w, slow.off, slow.err)
					}
				}
			}
		}
	}
}
