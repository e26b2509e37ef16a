package share

import (
	"time"

	"github.com/cespare/xxhash/v2"
)

// A Follower merges the batches of an endpoint that several Relays relay
// into the one stream of batches the Sink is handed: each batch once, in
// the engine's order, and a clear only when no Relay carries the stream
// any more (see Follower). The Relays that carry it are those "in sync":
// one whose batch was handed on, or whose batch was found to be one handed
// on (same number, same payload). The others' batches are dropped, but
// for the next batch due, a batch that nobody else carries, or one of a
// Relay that takes the endpoint over.

// Bounds of what a Follower keeps per endpoint.
const (
	maxStreams      = 4096 // endpoints followed so
	maxStreamRelays = 4    // Relays per endpoint
	streamWindow    = 16   // batches handed on remembered, to tell a repeat
	// takeoverAfter is how long the Relays in sync must relay nothing of
	// an endpoint before another Relay, ahead of them, takes it over.
	takeoverAfter = 3 * time.Second
	// streamIdle is how long an endpoint without batches is remembered.
	streamIdle = 3 * maxRelayInterval
)

// stream is what a Follower knows of one endpoint's batches.
type stream struct {
	// last is the number of the last batch handed to the Sink since it
	// last cleared the endpoint, -1 if none.
	last int64
	// sums are the last batches handed on, batch n at n mod streamWindow.
	sums  [streamWindow]batchSum
	from  []streamFrom // the Relays of the endpoint, at most maxStreamRelays
	heard time.Time    // when a batch of it last arrived
}

// batchSum identifies a batch handed on: its number and a hash of its
// payload.
type batchSum struct {
	seq int64
	sum uint64
	ok  bool
}

// streamFrom is what a stream knows of one of its Relays.
type streamFrom struct {
	r    *relayLife
	seq  int64     // its last batch of the endpoint; -1 if none
	sync bool      // it carries the batches handed on
	seen time.Time // when its last batch of the endpoint arrived
}

// index returns the position of Relay r in s.from, or -1.
func (s *stream) index(r *relayLife) int {
	for i := range s.from {
		if s.from[i].r == r {
			return i
		}
	}
	return -1
}

// remove forgets the Relay at s.from[i].
func (s *stream) remove(i int) {
	s.from = append(s.from[:i], s.from[i+1:]...)
}

// add returns the position of Relay r in s.from, adding it if need be, in
// place of the Relay heard from least lately if there is no room.
func (s *stream) add(r *relayLife) int {
	if i := s.index(r); i >= 0 {
		return i
	}
	if len(s.from) < maxStreamRelays {
		s.from = append(s.from, streamFrom{r: r, seq: -1})
		return len(s.from) - 1
	}
	old := 0
	for i := range s.from {
		if s.from[i].seen.Before(s.from[old].seen) {
			old = i
		}
	}
	s.from[old] = streamFrom{r: r, seq: -1}
	return old
}

// synced reports whether a Relay but the one at s.from[except] (-1 for
// none) carries the batches handed on.
func (s *stream) synced(except int) bool {
	for i := range s.from {
		if i != except && s.from[i].sync {
			return true
		}
	}
	return false
}

// silent reports whether the Relays in sync relayed no batch of the
// endpoint within takeoverAfter before now.
func (s *stream) silent(now time.Time) bool {
	for i := range s.from {
		if f := &s.from[i]; f.sync && now.Sub(f.seen) < takeoverAfter {
			return false
		}
	}
	return true
}

// reset forgets the batches handed on: the Sink cleared the endpoint.
func (s *stream) reset() {
	s.last = -1
	s.sums = [streamWindow]batchSum{}
}

// stream returns the stream of key, made if need be, or nil if the
// Follower follows maxStreams endpoints already.
func (f *Follower) stream(key string) *stream {
	s := f.streams[key]
	if s == nil {
		if len(f.streams) >= maxStreams {
			return nil
		}
		s = &stream{last: -1}
		f.streams[key] = s
	}
	return s
}

// batch hands batch seq of key, relayed by r (nil if not followed), to
// the Sink unless it is a repeat, or of a Relay not known to carry the
// batches handed on.
func (f *Follower) batch(key string, seq int64, payload []byte, r *relayLife) {
	var s *stream
	if r != nil {
		s = f.stream(key)
	}
	if s == nil {
		f.sink.Apply(key, seq, payload)
		return
	}
	now := f.clock.Now()
	s.heard = now
	i := s.add(r)
	e := &s.from[i]
	if e.seq >= 0 && seq <= e.seq {
		// Its own sequence went back (its clear was lost, or it did not
		// send one): it no longer carries what was handed on. If no other
		// Relay does, its batch is handed on below, and the Sink reads the
		// sequence going back as an engine restart.
		e.sync = false
	}
	e.seq, e.seen = seq, now
	sum := xxhash.Sum64(payload)
	b := s.sums[seq%streamWindow]
	known := b.ok && b.seq == seq
	switch {
	case known && b.sum == sum:
		e.sync = true // a repeat: it carries the same batches
		return
	case !e.sync && !s.synced(i):
		// No Relay carries the endpoint: this one's batches are those
		// handed on.
	case known:
		// Another batch under a number handed on: an engine that
		// restarted, or a Relay still on the engine's previous process.
		// The Relays in sync decide, while they relay.
		e.sync = false
		if !s.silent(now) {
			return
		}
		s.unsync()
	case seq == s.last+1, e.sync && seq > s.last:
		// The batch due, or a later one of a Relay in sync (a gap the
		// Sink sees).
	case seq > s.last && s.silent(now):
		// Ahead of the Relays in sync, which relay nothing any more: it
		// takes the endpoint over.
		s.unsync()
	default:
		// Handed on already by a Relay ahead of this one, or a batch of a
		// Relay not known to carry the endpoint's batches.
		return
	}
	e.sync = true
	if seq <= s.last {
		s.reset() // the Sink reads an engine restart, and clears
	}
	s.last = seq
	s.sums[seq%streamWindow] = batchSum{seq: seq, sum: sum, ok: true}
	f.sink.Apply(key, seq, payload)
}

// unsync marks every Relay of s as not carrying the batches handed on.
func (s *stream) unsync() {
	for i := range s.from {
		s.from[i].sync = false
	}
}

// clear handles a clear of key relayed by r (nil if not followed): the
// Sink clears the endpoint unless another Relay carries its batches.
func (f *Follower) clear(key string, r *relayLife) {
	s := f.streams[key]
	if r == nil || s == nil {
		// Of a Relay not followed, or of an endpoint not followed: the
		// stream, if any, goes on from the batches handed on, which the
		// Sink takes as new after the clear.
		f.sink.Apply(key, -1, nil)
		return
	}
	i := s.index(r)
	if i < 0 {
		if !s.synced(-1) {
			f.sink.Apply(key, -1, nil)
			s.reset()
		}
		return
	}
	f.release(key, s, i)
}

// release forgets the Relay at s.from[i], the stream of key, and clears
// the endpoint at the Sink unless another Relay carries its batches; it
// reports whether it did.
func (f *Follower) release(key string, s *stream, i int) bool {
	s.remove(i)
	cleared := !s.synced(-1)
	if cleared {
		f.sink.Apply(key, -1, nil)
		s.reset()
	}
	if len(s.from) == 0 {
		delete(f.streams, key)
	}
	return cleared
}
