package share

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"unsafe"
)

// The wire format, version 2. Every integer is an unsigned varint unless
// noted; strings are a varint length and that many bytes.
//
//	byte     version (2; 1 is read too)
//	string   sender id
//	8 bytes  incarnation, little endian: random per Group, so a restarted
//	         sender's sequence numbers start afresh
//	         sequence number, increasing per message of one incarnation
//	         width: nanoseconds per time bucket
//	         phase: nanoseconds from the start of the newest bucket to the
//	         moment the message was built, below width
//	         horizon: buckets of the ring; a bucket of age horizon holds
//	         every request picked before the ring
//	         endpoints, then per endpoint:
//	  string   key
//	           buckets, then per bucket, by increasing age:
//	             age (0 = newest), requests outstanding, of those queued
//	             (before their first token), tokens of work, and (not
//	             in version 1) of those the queued requests' prompt
//	             tokens still to prefill
//	           finished counts, then per count, by increasing age:
//	             age (0 = the start of the newest bucket, 1 = the start of
//	             the one before...), requests picked before that boundary
//	             and finished after it
//	         routes, then per route (a pick's prefix blocks):
//	           endpoint (index into the endpoints above), blocks, then
//	           blocks x 8 bytes little endian
//
// A message describes the sender's requests in flight as an absolute
// snapshot, so a lost one costs nothing: the next replaces it.

const wireVersion = 2

// Limits the decoder enforces on any input. They bound what one message can
// make a receiver allocate: at most a few times its length.
const (
	maxMessageBytes = 8 << 20
	maxIDBytes      = 256
	maxKeyBytes     = 1024
	maxWireEPs      = 1 << 14
	maxHorizon      = 1024
	maxCount        = 1<<31 - 1
	maxTokens       = 1<<53 - 1
	maxWireBlocks   = 1 << 17 // blocks over all routes of a message
	maxWidth        = 60e9    // nanoseconds per bucket: a minute
)

// message is one decoded batch of a sender.
type message struct {
	id      string
	inc     uint64
	seq     uint64
	width   int64 // nanoseconds
	phase   int64 // nanoseconds
	horizon int
	eps     []epSnap
	routes  []route
	blocks  []uint64 // a snapshot's: the routes' blocks, back to back
}

// epSnap is a sender's in-flight work at one endpoint, by pick time.
type epSnap struct {
	key     string
	buckets []bucket
	fin     []finCount
}

// finCount is the number of a sender's requests in flight at a bucket
// boundary that have finished since.
type finCount struct {
	age int // boundary: the start of the bucket of that age
	n   int64
}

// bucket is the work of the requests picked in one time bucket.
type bucket struct {
	age    int
	out    int64 // requests picked and not done
	queued int64 // of out, those before their first token
	tokens int64 // prompt tokens not yet prefilled plus expected decode tokens
	// prefill is the part of tokens that the queued requests have still to
	// prefill; -1 when unknown (a version 1 sender).
	prefill int64
}

// route is the prefix blocks of one pick.
type route struct {
	ep     int // index into message.eps
	blocks []uint64
}

// appendMessage appends the encoding of m to dst.
func appendMessage(dst []byte, m *message) []byte {
	dst = append(dst, wireVersion)
	dst = appendString(dst, m.id)
	dst = binary.LittleEndian.AppendUint64(dst, m.inc)
	dst = binary.AppendUvarint(dst, m.seq)
	dst = binary.AppendUvarint(dst, uint64(m.width))
	dst = binary.AppendUvarint(dst, uint64(m.phase))
	dst = binary.AppendUvarint(dst, uint64(m.horizon))
	dst = binary.AppendUvarint(dst, uint64(len(m.eps)))
	for i := range m.eps {
		dst = appendEP(dst, &m.eps[i])
	}
	dst = binary.AppendUvarint(dst, uint64(len(m.routes)))
	for _, r := range m.routes {
		dst = binary.AppendUvarint(dst, uint64(r.ep))
		dst = binary.AppendUvarint(dst, uint64(len(r.blocks)))
		for _, h := range r.blocks {
			dst = binary.LittleEndian.AppendUint64(dst, h)
		}
	}
	return dst
}

// appendEP appends the encoding of one endpoint of a message to dst.
func appendEP(dst []byte, e *epSnap) []byte {
	dst = appendString(dst, e.key)
	dst = binary.AppendUvarint(dst, uint64(len(e.buckets)))
	for _, b := range e.buckets {
		dst = binary.AppendUvarint(dst, uint64(b.age))
		dst = binary.AppendUvarint(dst, uint64(b.out))
		dst = binary.AppendUvarint(dst, uint64(b.queued))
		dst = binary.AppendUvarint(dst, uint64(b.tokens))
		dst = binary.AppendUvarint(dst, uint64(max(b.prefill, 0)))
	}
	dst = binary.AppendUvarint(dst, uint64(len(e.fin)))
	for _, f := range e.fin {
		dst = binary.AppendUvarint(dst, uint64(f.age))
		dst = binary.AppendUvarint(dst, uint64(f.n))
	}
	return dst
}

func appendString(dst []byte, s string) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(s)))
	return append(dst, s...)
}

// decoder reads a message, remembering the first error.
type decoder struct {
	b   []byte
	off int // bytes of b read
	err error
}

// left returns the bytes of b not yet read.
func (d *decoder) left() int { return len(d.b) - d.off }

// fail records an error, and leaves nothing to read.
func (d *decoder) fail(format string, args ...any) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: "+format, append([]any{ErrMalformed}, args...)...)
	}
	d.off = len(d.b)
}

// small reads a varint of one or two bytes no larger than limit, as most
// are, and reports false, reading nothing, for any other: the caller then
// calls uint. It is small enough to be inlined in the loops over buckets.
func (d *decoder) small(limit uint64) (uint64, bool) {
	b := d.b[d.off:]
	switch {
	case len(b) > 0 && b[0] < 0x80 && uint64(b[0]) <= limit:
		d.off++
		return uint64(b[0]), true
	case len(b) > 1 && b[1] < 0x80:
		// A first byte below 0x80 is a one-byte varint over limit: then
		// v is too, and uint says so.
		if v := uint64(b[0]&0x7f) | uint64(b[1])<<7; v <= limit {
			d.off += 2
			return v, true
		}
	}
	return 0, false
}

// uint reads a varint no larger than limit.
func (d *decoder) uint(what string, limit uint64) uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b[d.off:])
	if n <= 0 {
		d.fail("truncated or overlong %s", what)
		return 0
	}
	d.off += n
	if v > limit {
		d.fail("%s %d exceeds %d", what, v, limit)
		return 0
	}
	return v
}

// bytes reads a string's bytes, at most limit of them; its length is
// named lengthWhat in errors, itself what.
func (d *decoder) bytes(lengthWhat, what string, limit int) []byte {
	n := int(d.uint(lengthWhat, uint64(limit)))
	if d.err != nil {
		return nil
	}
	if n > d.left() {
		d.fail("truncated %s", what)
		return nil
	}
	s := d.b[d.off : d.off+n]
	d.off += n
	return s
}

func (d *decoder) fixed64(what string) uint64 {
	if d.err != nil {
		return 0
	}
	if d.left() < 8 {
		d.fail("truncated %s", what)
		return 0
	}
	v := binary.LittleEndian.Uint64(d.b[d.off:])
	d.off += 8
	return v
}

// decodeSender reads the sender's id (bytes of b) and incarnation at the
// head of message b, and reports false if b is not a message of a version
// it reads or too short to name them. It reads nothing after them, so
// that a receiver ignores its own batches, which NATS echoes back to it,
// without decoding them.
func decodeSender(b []byte) (id []byte, inc uint64, ok bool) {
	if len(b) == 0 || len(b) > maxMessageBytes || (b[0] != wireVersion && b[0] != 1) {
		return nil, 0, false
	}
	d := &decoder{b: b[1:]}
	id = d.bytes("id length", "id", maxIDBytes)
	inc = d.fixed64("incarnation")
	return id, inc, d.err == nil
}

// decode parses one message. It never panics, and it allocates at most a
// small multiple of len(b): every element it allocates for takes at least
// one byte of input.
func decode(b []byte) (*message, error) {
	m := &message{}
	if err := decodeInto(m, &keyTable{}, b); err != nil {
		return nil, err
	}
	return m, nil
}

// decodeInto decodes b into m as decode does, reusing the memory of m's
// slices and the keys of keys from an earlier call, so that decoding a
// receiver's steady stream of batches allocates nothing. On error m holds
// a partial message.
func decodeInto(m *message, keys *keyTable, b []byte) error {
	var grown int
	return decodeGrowing(m, keys, b, &grown)
}

// decodeGrowing is decodeInto, adding to *grown the bytes by which it grew
// the memory of m's slices. Those of all its routes and endpoints are kept
// for the next message, whether or not it uses them, so a receiver sums
// them to bound what it keeps.
func decodeGrowing(m *message, keys *keyTable, b []byte, grown *int) error {
	if len(b) > maxMessageBytes {
		return fmt.Errorf("%w: %d bytes exceeds %d", ErrMalformed, len(b), maxMessageBytes)
	}
	if len(b) == 0 {
		return fmt.Errorf("%w: empty", ErrMalformed)
	}
	version := b[0]
	if version != wireVersion && version != 1 {
		return fmt.Errorf("%w: version %d, want 1 or %d", ErrMalformed, b[0], wireVersion)
	}
	d := &decoder{b: b[1:]}
	keys.reset()
	m.eps, m.routes = m.eps[:0], m.routes[:0]
	m.id = keys.key(d.bytes("id length", "id", maxIDBytes))
	m.inc = d.fixed64("incarnation")
	m.seq = d.uint("sequence", math.MaxUint64)
	m.width = int64(d.uint("width", maxWidth))
	m.phase = int64(d.uint("phase", math.MaxInt64))
	m.horizon = int(d.uint("horizon", maxHorizon))
	if d.err == nil {
		switch {
		case m.id == "":
			d.fail("empty id")
		case m.width <= 0:
			d.fail("width %d not positive", m.width)
		case m.phase >= m.width:
			d.fail("phase %d not below width %d", m.phase, m.width)
		case m.horizon < 1:
			d.fail("horizon %d below 1", m.horizon)
		}
	}
	neps := int(d.uint("endpoints", maxWireEPs))
	if d.err == nil && neps > d.left() {
		d.fail("%d endpoints in %d bytes", neps, d.left())
	}
	if d.err == nil && neps > 0 {
		m.eps = growKept(grown, m.eps, neps)
	}
	for i := 0; i < neps && d.err == nil; i++ {
		e := &m.eps[i]
		e.key = keys.key(d.bytes("key length", "key", maxKeyBytes))
		if d.err == nil && e.key == "" {
			d.fail("empty endpoint key")
		}
		if d.err == nil && !keys.add(e.key) {
			d.fail("duplicate endpoint %q", e.key)
		}
		nb := int(d.uint("buckets", uint64(m.horizon)+1))
		if d.err == nil && nb > d.left() {
			d.fail("%d buckets in %d bytes", nb, d.left())
		}
		e.buckets = e.buckets[:0]
		if d.err == nil && nb > 0 {
			e.buckets = growKept(grown, e.buckets, nb)
		}
		prev := -1
		for j := range e.buckets {
			bk := &e.buckets[j]
			age, ok := d.small(uint64(m.horizon))
			if !ok {
				age = d.uint("age", uint64(m.horizon))
			}
			out, ok := d.small(maxCount)
			if !ok {
				out = d.uint("outstanding", maxCount)
			}
			queued, ok := d.small(maxCount)
			if !ok {
				queued = d.uint("queued", maxCount)
			}
			tokens, ok := d.small(maxTokens)
			if !ok {
				tokens = d.uint("tokens", maxTokens)
			}
			bk.age, bk.out, bk.queued, bk.tokens, bk.prefill = int(age), int64(out), int64(queued), int64(tokens), -1
			if version > 1 {
				prefill, ok := d.small(maxTokens)
				if !ok {
					prefill = d.uint("prefill", maxTokens)
				}
				bk.prefill = int64(prefill)
			}
			if d.err != nil {
				break
			}
			if bk.prefill > bk.tokens {
				d.fail("%d prefill tokens of %d", bk.prefill, bk.tokens)
			}
			if bk.age <= prev {
				d.fail("bucket ages not increasing")
			}
			if bk.queued > bk.out {
				d.fail("%d queued of %d outstanding", bk.queued, bk.out)
			}
			prev = bk.age
		}
		nf := int(d.uint("finished counts", uint64(m.horizon)))
		if d.err == nil && nf > d.left() {
			d.fail("%d finished counts in %d bytes", nf, d.left())
		}
		e.fin = e.fin[:0]
		if d.err == nil && nf > 0 {
			e.fin = growKept(grown, e.fin, nf)
		}
		prev = -1
		for j := 0; j < nf && d.err == nil; j++ {
			f := &e.fin[j]
			age, ok := d.small(uint64(m.horizon - 1))
			if !ok {
				age = d.uint("finished age", uint64(m.horizon-1))
			}
			n, ok := d.small(maxCount)
			if !ok {
				n = d.uint("finished", maxCount)
			}
			f.age, f.n = int(age), int64(n)
			if d.err == nil && f.age <= prev {
				d.fail("finished ages not increasing")
			}
			prev = f.age
		}
	}
	nr := int(d.uint("routes", maxWireBlocks))
	if d.err == nil && nr > d.left() {
		d.fail("%d routes in %d bytes", nr, d.left())
	}
	if d.err == nil && nr > 0 {
		m.routes = growKept(grown, m.routes, nr)
	}
	total := 0
	for i := 0; i < nr && d.err == nil; i++ {
		r := &m.routes[i]
		r.ep = int(d.uint("route endpoint", uint64(max(neps-1, 0))))
		if d.err == nil && neps == 0 {
			d.fail("route without endpoints")
		}
		n := int(d.uint("route blocks", maxWireBlocks))
		if d.err != nil {
			break
		}
		total += n
		switch {
		case n == 0:
			d.fail("route without blocks")
		case total > maxWireBlocks:
			d.fail("more than %d blocks", maxWireBlocks)
		case n > d.left()/8:
			d.fail("truncated blocks")
		}
		if d.err != nil {
			break
		}
		r.blocks = growKept(grown, r.blocks, n)
		for j := range r.blocks {
			r.blocks[j] = binary.LittleEndian.Uint64(d.b[d.off+8*j:])
		}
		d.off += 8 * n
	}
	if d.err == nil && d.left() != 0 {
		d.fail("%d trailing bytes", d.left())
	}
	return d.err
}

// keyTable is the endpoint keys decodeInto has read: those of the message
// being decoded, to refuse a duplicate, and those of earlier messages, so
// that a key read again is not allocated again. It keeps at most about
// maxKnownKeyBytes of keys between messages.
type keyTable struct {
	batch map[string]struct{} // the message's keys
	known map[string]string   // keys read before
	bytes int                 // of the keys in known
}

const maxKnownKeyBytes = 1 << 20

// reset readies t for a new message.
func (t *keyTable) reset() {
	if t.batch == nil {
		t.batch = make(map[string]struct{})
		t.known = make(map[string]string)
	}
	clear(t.batch)
	if t.bytes > maxKnownKeyBytes {
		t.known = make(map[string]string)
		t.bytes = 0
	}
}

// key returns b as a string, the one read before if there is one.
func (t *keyTable) key(b []byte) string {
	if k, ok := t.known[string(b)]; ok {
		return k
	}
	k := string(b)
	t.known[k] = k
	t.bytes += len(k)
	return k
}

// add adds k to the message's keys, and reports false if it was there.
func (t *keyTable) add(k string) bool {
	if _, dup := t.batch[k]; dup {
		return false
	}
	t.batch[k] = struct{}{}
	return true
}

// grow returns s resized to n elements, reusing its memory if it has room:
// the elements keep what an earlier use left there (the slices of a reused
// epSnap or route, to be reused in turn), so the caller sets every field.
func grow[T any](s []T, n int) []T {
	return slices.Grow(s[:0], n)[:n]
}

// growKept is grow, adding to *kept the bytes by which it grew s's memory.
func growKept[T any](kept *int, s []T, n int) []T {
	old := cap(s)
	s = grow(s, n)
	if c := cap(s); c != old {
		*kept += (c - old) * int(unsafe.Sizeof(s[0]))
	}
	return s
}
