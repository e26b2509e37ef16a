package model

import (
	"fmt"
	"iter"
	"slices"
)

// Sequence states.
const (
	StatePending   uint8 = iota // not yet submitted to a replica
	StateWaiting                // in a replica's waiting queue
	StateRunning                // in a replica's running batch
	StateDone                   // finished
	StateRejected               // can never fit in the replica's KV cache
	StateCancelled              // removed by Replica.Cancel
	StateRefused                // refused by the simulator's admission control
	StateReceiving              // admitted, its prompt's KV on its way from a prefill worker
)

// Sequence is one request inside a [Replica]: its size and prompt prefix,
// set by the caller before [Replica.Submit], and its progress, kept by the
// replica. A Sequence is submitted once and must not be copied afterwards.
// Like its Replica, it is not safe for concurrent use.
type Sequence struct {
	// The progress comes first, so that it shares a cache line with ID:
	// a simulation steps through hundreds of thousands of sequences, and
	// the fewer lines each costs the fewer cache misses. While the
	// sequence decodes, its replica keeps the progress of each iteration
	// in its lane (see lane) and brings these fields up to date only when
	// it reports a token of the sequence or lets it go. The counts of KV
	// blocks fit in 32 bits.
	state     uint8
	admitted  bool // admitted at least once (cache hit counted)
	onAdapter bool // counted as a running user of its adapter's slot
	// remote marks a sequence whose prompt was prefilled on another
	// replica: admitted, it takes KV blocks for the whole prompt and waits
	// in Replica.receiving for the KV, computing nothing (see disagg.go).
	remote    bool
	private   int32 // KV blocks owned by this sequence alone
	shared    int32 // KV blocks of held cache entries
	target    int   // tokens to prefill: the prompt, plus output on recompute
	computed  int   // tokens prefilled so far (including those from cache)
	decoded   int   // tokens appended by decode steps since the last prefill
	generated int   // output tokens emitted
	output    int   // OutputTokens, as submitted

	// ID is the caller's name for the sequence; the replica does not read
	// it.
	ID int
	// PromptTokens and OutputTokens are the prompt length and the number of
	// tokens to generate; both must be positive.
	PromptTokens, OutputTokens int
	// Prefix holds the chained hashes of the prompt's leading blocks of
	// BlockTokens tokens each, a positive multiple of the replica's block
	// size. Only these blocks are cached and matched; nil disables prefix
	// caching for the sequence.
	Prefix      []uint64
	BlockTokens int
	// Reply holds the chained hashes of the blocks cached when the
	// sequence completes, beyond the prompt's full blocks (see
	// [Request.Reply]); each covers BlockTokens tokens. nil caches no
	// output.
	Reply []uint64
	// Adapter names the sequence's LoRA adapter, "" for the base model;
	// read only by a replica with [Engine].AdapterSlots.
	Adapter string

	held        []int32 // referenced cache entries (kvPool.ents), in prefix order
	cached      int     // prompt tokens served from cache at first admission
	preemptions int
}

// Generated returns the number of output tokens emitted so far. On a
// replica with quiet decoding ([Replica.SetQuietDecode]), the count of a
// running sequence is up to date only when [Replica.Finish] returns the
// sequence and after [Replica.Running].
func (s *Sequence) Generated() int { return s.generated }

// Done reports whether the sequence emitted all its output tokens.
func (s *Sequence) Done() bool { return s.state == StateDone }

// warmAhead is the least number of scattered reads worth a warm-up loop: a
// large simulation finds a batch's sequences, the cache slots of a chunk's
// blocks and the cache entries a sequence holds outside the processor's
// caches, and reading them all first, each read independent of the others,
// lets their misses overlap instead of stalling the work on them one by
// one.
const warmAhead = 8

// Replica is the scheduling state machine of one continuous-batching engine,
// without a clock: [Replica.Plan] decides the next iteration and returns the
// batch whose duration the caller models (with [Engine].IterTime) and waits
// for, simulated or real, and [Replica.Finish] applies it. The simulator and
// an emulated engine both drive it. A Replica is not safe for concurrent use.
type Replica struct {
	// The state an iteration reads comes first, the KV pool's counters
	// with it: in a simulation of many replicas, the others' iterations
	// push a replica's state out of the processor's caches between two of
	// its own, and the fewer cache lines an iteration reads the fewer
	// misses it takes.
	running []*Sequence
	lanes   []lane // the running sequences' lanes, in the same order
	emitted []*Sequence
	waiting []*Sequence // FIFO from whead
	whead   int
	eng     Engine
	quiet   bool // SetQuietDecode's setting

	preemptions int
	decodes     int64 // tokens emitted by decode steps

	receiving []*Sequence // remote sequences admitted, their KV on its way
	started   []*Sequence // remote sequences admitted since the caller last took them

	kv    kvPool
	wmark int // watermark blocks kept free when admitting
	// warmed keeps the reads of the warm-ups (see warmAhead).
	warmed uint64

	prefixQueries int64
	prefixHits    int64

	slots        []adapterSlot // with Engine.AdapterSlots: the adapters loaded
	tick         uint64        // admissions so far, the clock of the slots' LRU
	adapterLoads int64

	prefilled int64 // prompt tokens computed by prefill chunks
}

// lane is the part of a running sequence's state that every iteration reads
// and writes, kept in Replica.lanes, beside Replica.running: an iteration
// reads its batch's lanes, a few cache lines, and a decoding sequence only
// when it emits a token the replica reports (see Replica.SetQuietDecode),
// is preempted or cancelled. In a simulation of many replicas the
// sequences lie all over memory, and reading each at every iteration, one
// cache miss a token, cost more than the rest of the iteration.
//
// A decoding sequence's lane counts what it emitted and allocated since
// its fields were last brought up to date (see settle): left counts down
// from OutputTokens less Generated, and grown up from 0.
type lane struct {
	chunk int32 // tokens scheduled in the current iteration
	// left is the output tokens a decoding sequence has still to emit: 0
	// while the sequence prefills, or decodes without a lane (see
	// Replica.startLane), and -1 once it completed, until Finish drops it.
	left int32
	// room is the tokens a decoding sequence's KV blocks hold beyond its
	// own, counting the current iteration's token as its own.
	room int32
	// grown is the KV blocks a decoding sequence allocated since its
	// private count was last brought up to date.
	grown int32
}

// settle brings the progress of s, which decodes in lane ln, up to date:
// the tokens it emitted and the blocks it allocated.
func settle(s *Sequence, ln *lane) {
	d := s.output - s.generated - int(ln.left)
	s.generated += d
	s.decoded += d
	s.private += ln.grown
	ln.grown = 0
}

// ReplicaStats is a snapshot of a [Replica]'s state and counters.
type ReplicaStats struct {
	// Running and Waiting are the sequences in the batch and in the queue.
	Running, Waiting int
	// KVUsed is the KV blocks held by sequences, KVCached those of cached
	// prefix blocks no sequence holds (evicted when needed), KVTotal the
	// capacity.
	KVUsed, KVCached, KVTotal int
	// PrefixQueries and PrefixHits count prompt tokens looked up in the
	// prefix cache and found there, at each sequence's first admission.
	PrefixQueries, PrefixHits int64
	// Preemptions counts sequences preempted to free KV blocks.
	Preemptions int64
	// AdapterLoads counts LoRA adapters loaded into slots.
	AdapterLoads int64
	// Prefilled counts the prompt tokens computed by prefill chunks, and
	// Decoded the tokens emitted by decode steps.
	Prefilled, Decoded int64
}

// NewReplica returns an idle replica configured by eng (zero fields are the
// documented defaults), or an error wrapping [ErrInvalidConfig].
func NewReplica(eng Engine) (*Replica, error) {
	if err := eng.Normalize(); err != nil {
		return nil, err
	}
	r := &Replica{eng: eng, wmark: eng.KVBlocks / 100}
	r.kv.init(eng.KVBlocks)
	return r, nil
}

// SetKVEventHandler makes the replica report its prefix cache the way an
// engine's KV event stream does (vLLM's BlockStored and BlockRemoved): fn is
// called, synchronously, with stored true when a prompt block enters the
// cache (in the iteration whose prefill chunk completed it, so a long prompt's
// blocks are reported chunk by chunk during its prefill) and false when it is
// evicted. hash is the block's chained hash from
// [Request.Prefix], so one event covers [Request.BlockTokens] tokens. Nil
// stops the reports.
func (r *Replica) SetKVEventHandler(fn func(hash uint64, stored bool)) { r.kv.onEvent = fn }

// SetKVEventsHandler is SetKVEventHandler for a handler of batches: fn
// hears the same events, in the same order, each run of events of one kind
// at once, before the Plan, Finish or Receive that made it returns.
func (r *Replica) SetKVEventsHandler(fn func(hashes []uint64, stored bool)) { r.kv.onEvents = fn }

// SetQuietDecode sets whether [Replica.Finish] leaves out the decode tokens
// between a sequence's first and last: with quiet decoding, Finish returns
// only the sequences whose token ends a prefill, is their first, or is
// their last. The replica schedules, allocates, preempts and completes the
// sequences as it does without it, but the progress of a running sequence
// ([Sequence.Generated] and [Sequence.Decoded]) is up to date only when
// Finish returns it and after [Replica.Running]. It suits a caller that
// acts only on those tokens: a simulation of many replicas then reads each
// decoding sequence twice instead of at every token.
func (r *Replica) SetQuietDecode(on bool) { r.quiet = on }

// Engine returns the replica's configuration with defaults filled in.
func (r *Replica) Engine() Engine { return r.eng }

// Stats returns a snapshot of the replica's state and counters.
func (r *Replica) Stats() ReplicaStats {
	return ReplicaStats{
		Running:       len(r.running),
		Waiting:       r.NumWaiting(),
		KVUsed:        r.kv.used,
		KVCached:      r.kv.evictable,
		KVTotal:       r.kv.total,
		PrefixQueries: r.prefixQueries,
		PrefixHits:    r.prefixHits,
		Preemptions:   int64(r.preemptions),
		AdapterLoads:  r.adapterLoads,
		Prefilled:     r.prefilled,
		Decoded:       r.decodes,
	}
}

func (r *Replica) BlocksFor(tokens int) int {
	return (tokens + r.eng.BlockSize - 1) / r.eng.BlockSize
}

// Fits reports whether s can ever run on this replica: its prompt and
// output together fit in the KV cache.
func (r *Replica) Fits(s *Sequence) bool {
	return r.BlocksFor(s.PromptTokens+s.OutputTokens) <= r.kv.total
}

func (r *Replica) NumWaiting() int { return len(r.waiting) - r.whead }

// Submit appends s to the waiting queue. It returns an error wrapping
// [ErrInvalidWorkload] if s was submitted before, has a non-positive or
// too large length, uses prefix blocks that are not a multiple of the
// block size, or does not [Replica.Fits].
func (r *Replica) Submit(s *Sequence) error {
	switch {
	case s.state != StatePending:
		return fmt.Errorf("%w: sequence %d submitted twice", ErrInvalidWorkload, s.ID)
	case s.PromptTokens < 1 || s.PromptTokens > maxTokens || s.OutputTokens < 1 || s.OutputTokens > maxTokens:
		return fmt.Errorf("%w: sequence %d has %d prompt and %d output tokens", ErrInvalidWorkload, s.ID, s.PromptTokens, s.OutputTokens)
	case len(s.Prefix) > 0 && (s.BlockTokens < r.eng.BlockSize || s.BlockTokens%r.eng.BlockSize != 0):
		return fmt.Errorf("%w: sequence %d has %d tokens per prefix hash; want a multiple of the block size %d", ErrInvalidWorkload, s.ID, s.BlockTokens, r.eng.BlockSize)
	case !r.Fits(s):
		return fmt.Errorf("%w: sequence %d does not fit in the KV cache", ErrInvalidWorkload, s.ID)
	}
	s.state = StateWaiting
	s.target = s.PromptTokens
	s.output = s.OutputTokens
	r.waiting = append(r.waiting, s)
	return nil
}

// Cancel removes a waiting or running s from the replica at once and frees
// its KV blocks; s cannot be submitted again. It returns false if s is not
// waiting or running in the replica. Cancelling a sequence of the planned
// iteration between [Replica.Plan] and [Replica.Finish] drops its share of
// that iteration.
func (r *Replica) Cancel(s *Sequence) bool {
	switch s.state {
	case StateWaiting:
		// Search from the tail: callers cancelling many sequences do so
		// newest first.
		i := len(r.waiting) - 1
		for i >= r.whead && r.waiting[i] != s {
			i--
		}
		if i < r.whead {
			return false
		}
		copy(r.waiting[i:], r.waiting[i+1:])
		r.waiting[len(r.waiting)-1] = nil
		r.waiting = r.waiting[:len(r.waiting)-1]
		if r.whead == len(r.waiting) {
			r.waiting, r.whead = r.waiting[:0], 0
		}
	case StateRunning:
		i := len(r.running) - 1
		for i >= 0 && r.running[i] != s {
			i--
		}
		if i < 0 {
			return false
		}
		if ln := &r.lanes[i]; ln.left > 0 {
			settle(s, ln)
		}
		r.running = slices.Delete(r.running, i, i+1)
		r.lanes = slices.Delete(r.lanes, i, i+1)
	default:
		return false
	}
	r.releaseBlocks(s)
	s.held = nil
	s.state = StateCancelled
	return true
}

func (r *Replica) pushFront(s *Sequence) {
	s.state = StateWaiting
	if r.whead > 0 {
		r.whead--
		r.waiting[r.whead] = s
		return
	}
	r.waiting = append(r.waiting, nil)
	copy(r.waiting[1:], r.waiting)
	r.waiting[0] = s
}

func (r *Replica) popFront() {
	r.waiting[r.whead] = nil
	r.whead++
	if r.whead == len(r.waiting) {
		r.waiting, r.whead = r.waiting[:0], 0
	} else if r.whead > 1024 && r.whead*2 > len(r.waiting) {
		n := copy(r.waiting, r.waiting[r.whead:])
		clear(r.waiting[n:])
		r.waiting, r.whead = r.waiting[:n], 0
	}
}

// Plan schedules the next iteration and returns its batch, or false if
// there is nothing to do. Every running sequence gets its next prefill chunk
// or one decode token within the token budget, KV blocks are allocated for
// them (preempting the newest running sequences when the cache is full; a
// preempted sequence returns to the head of the queue and later recomputes
// its prompt and output so far), and waiting sequences are admitted in order
// while budget, batch slots and KV blocks last, keeping 1% of the blocks
// free while others run; with [Engine].AdapterSlots, a waiting sequence
// whose adapter cannot get a slot is skipped for later ones. After a Plan
// that returned true, call [Replica.Finish] when the iteration ends and
// before the next Plan.
func (r *Replica) Plan() (Batch, bool) {
	budget := r.eng.TokenBudget
	var b Batch
	preemptions := r.preemptions
	for i := 0; i < len(r.running); i++ {
		ln := &r.lanes[i]
		ln.chunk = 0
		if budget == 0 {
			continue
		}
		if ln.left > 0 {
			// A decoding sequence in its lane: one token, and one more
			// block when its blocks are full.
			if ln.room == 0 {
				if !r.allocRunning(i, 1) {
					break
				}
				ln.grown++
				ln.room = int32(r.eng.BlockSize)
			}
			ln.room--
			ln.chunk = 1
			budget--
			b.DecodeSeqs++
			continue
		}
		s := r.running[i]
		n := 1
		if s.computed < s.target {
			n = min(s.target-s.computed, budget)
		}
		need := r.BlocksFor(s.computed+s.decoded+n) - int(s.private) - int(s.shared)
		if !r.allocRunning(i, need) {
			break
		}
		s.private += int32(max(need, 0))
		ln.chunk = int32(n)
		budget -= n
		if s.computed < s.target {
			b.PrefillTokens += n
		} else {
			b.DecodeSeqs++
		}
	}
	preempted := r.preemptions != preemptions
	for !preempted && budget > 0 && r.NumWaiting() > 0 && len(r.running)+len(r.receiving) < r.eng.MaxRunning {
		w, slot := r.nextAdmissible()
		if w < 0 {
			break
		}
		s := r.waiting[w]
		r.match(s)
		n := min(s.target-s.computed, budget)
		if s.remote {
			n = s.target - s.computed // all of it arrives by transfer
		}
		need := r.BlocksFor(s.computed+n) - int(s.shared)
		reserve := 0
		if len(r.running) > 0 {
			reserve = r.wmark
		}
		if r.kv.available()-need < reserve || !r.kv.alloc(need) {
			r.releaseBlocks(s)
			break
		}
		r.removeWaiting(w)
		r.takeAdapter(s, slot, &b)
		if !s.admitted {
			s.admitted = true
			s.cached = s.computed
			r.prefixQueries += int64(s.PromptTokens)
			r.prefixHits += int64(s.computed)
		}
		s.private = int32(need)
		if s.remote {
			s.state = StateReceiving
			r.receiving = append(r.receiving, s)
			r.started = append(r.started, s)
			continue
		}
		s.state = StateRunning
		r.running = append(r.running, s)
		r.lanes = append(r.lanes, lane{chunk: int32(n)})
		budget -= n
		b.PrefillTokens += n
	}
	b.KVUsage = float64(r.kv.used) / float64(r.kv.total)
	r.kv.flush()
	return b, b.PrefillTokens+b.DecodeSeqs > 0
}

// allocRunning takes n blocks for the running sequence at i, preempting
// the newest running sequences while the cache cannot hold them. It
// reports false if it preempted the sequence at i itself.
func (r *Replica) allocRunning(i, n int) bool {
	for !r.kv.alloc(n) {
		last := len(r.running) - 1
		s := r.running[last]
		if ln := &r.lanes[last]; ln.left > 0 {
			settle(s, ln)
		}
		r.running = r.running[:last]
		r.lanes = r.lanes[:last]
		r.preempt(s)
		if last == i {
			return false
		}
	}
	return true
}

// match references the cached prefix of s and counts it as computed. At
// least one prompt token is always left to compute.
func (r *Replica) match(s *Sequence) {
	bt := s.BlockTokens
	if bt == 0 {
		return
	}
	if s.held == nil {
		// Room for every entry s can hold, its prompt's full blocks and
		// its reply's, at once rather than a doubling at a time.
		if n := min(len(s.Prefix), s.PromptTokens/bt) + len(s.Reply); n > 0 {
			s.held = make([]int32, 0, n)
		}
	}
	if len(s.Prefix) == 0 {
		return
	}
	maxBlocks := min(len(s.Prefix), (s.target-1)/bt)
	per := bt / r.eng.BlockSize
	start := len(s.held)
	for i := 0; i < maxBlocks; i++ {
		e := r.kv.lookup(s.Prefix[i])
		if e == 0 {
			break
		}
		if i == 0 && maxBlocks > 2 {
			// The prefix is cached: read the slots of the rest of its
			// blocks first, so that their cache misses overlap.
			r.warmed += r.kv.index.warm(s.Prefix[1:maxBlocks])
		}
		s.held = append(s.held, e)
	}
	// Then hold the entries found, read first for the same reason.
	got := s.held[start:]
	if len(got) > 1 {
		r.warmed += r.kv.warm(got)
	}
	for _, e := range got {
		r.kv.acquire(e)
	}
	s.shared += int32(len(got) * per)
	s.computed = len(s.held) * bt
}

// MatchTokens returns how many tokens of a prompt of promptTokens tokens,
// whose leading blocks of blockTokens tokens have the chained hashes prefix,
// this replica's cache holds now, without touching the cache.
func (r *Replica) MatchTokens(prefix []uint64, blockTokens, promptTokens int) int {
	bt := blockTokens
	if bt == 0 || len(prefix) == 0 {
		return 0
	}
	maxBlocks := min(len(prefix), (promptTokens-1)/bt)
	n := 0
	for n < maxBlocks && r.kv.lookup(prefix[n]) != 0 {
		n++
	}
	return n * bt
}

// releaseBlocks frees every KV block of s and resets its progress. Cache
// entries are released last block first, so the head of a prefix, shared
// most widely, is evicted last.
func (r *Replica) releaseBlocks(s *Sequence) {
	if len(s.held) >= warmAhead {
		r.warmed += r.kv.warm(s.held)
	}
	for i := len(s.held) - 1; i >= 0; i-- {
		r.kv.unref(s.held[i])
	}
	s.held = s.held[:0]
	r.kv.release(int(s.private))
	s.private, s.shared, s.computed, s.decoded = 0, 0, 0, 0
	r.releaseAdapter(s)
}

// preempt frees s's blocks and puts it back at the head of the waiting
// queue; it will recompute its prompt and the output generated so far.
func (r *Replica) preempt(s *Sequence) {
	r.releaseBlocks(s)
	s.target = s.PromptTokens + s.generated
	s.preemptions++
	r.preemptions++
	r.pushFront(s)
}

// Finish completes the planned iteration: prefill chunks advance and publish
// the prompt blocks they completed to the prefix cache, finished prefills
// emit a token,
// decoding sequences emit a token, and finished sequences leave, freeing
// their KV blocks. It returns the sequences that emitted a token, in batch
// order (with quiet decoding, only some of them; see
// [Replica.SetQuietDecode]); [Sequence.Generated] and [Sequence.Done] tell
// which token and whether it was the last. The slice is reused by the next
// Finish.
func (r *Replica) Finish() []*Sequence {
	// The sequences emitted by the previous Finish are not cleared from
	// the slice's spare capacity: at most a batch of them, overwritten as
	// it fills again.
	r.emitted = r.emitted[:0]
	if !r.quiet && len(r.running) >= warmAhead {
		// In a simulation of many replicas, the others' iterations ran
		// since Plan read this batch, whose sequences lie all over
		// memory: read them all first, so that their cache misses
		// overlap instead of stalling the loop below one by one.
		var acc int
		for _, s := range r.running {
			acc += s.output
		}
		r.warmed += uint64(acc)
	}
	done := 0
	for i := range r.lanes {
		ln := &r.lanes[i]
		n := ln.chunk
		if n == 0 {
			continue
		}
		ln.chunk = 0
		if ln.left > 0 {
			ln.left--
			r.decodes++
			if r.quiet && ln.left > 0 {
				continue
			}
			s := r.running[i]
			settle(s, ln)
			r.emitted = append(r.emitted, s)
			if ln.left == 0 {
				r.complete(s)
				ln.left = -1
				done++
			}
			continue
		}
		s := r.running[i]
		if s.computed < s.target {
			s.computed += int(n)
			r.prefilled += int64(n)
			r.publish(s)
			if s.computed < s.target {
				continue
			}
		} else {
			s.decoded++
			r.decodes++
		}
		s.generated++
		r.emitted = append(r.emitted, s)
		if s.generated >= s.output {
			r.complete(s)
			ln.left = -1
			done++
			continue
		}
		r.startLane(s, ln)
	}
	if done > 0 {
		k := 0
		for i, ln := range r.lanes {
			if ln.left >= 0 {
				r.running[k], r.lanes[k] = r.running[i], ln
				k++
			}
		}
		clear(r.running[k:])
		r.running, r.lanes = r.running[:k], r.lanes[:k]
	}
	r.kv.flush()
	return r.emitted
}

// startLane has s, running in lane ln, decode in its lane from now on,
// once it emitted a token: the first token of a sequence whose prompt was
// prefilled elsewhere is a decode token, which Finish must report, and
// such a sequence decodes it outside a lane.
func (r *Replica) startLane(s *Sequence, ln *lane) {
	bs := r.eng.BlockSize
	ln.left = int32(s.output - s.generated)
	ln.room = int32(int(s.private+s.shared)*bs - s.computed - s.decoded)
	ln.grown = 0
}

// publish moves the prompt blocks of s computed so far, beyond those already
// cached, into the prefix cache. It runs after every prefill chunk, as vLLM
// hashes and caches each full block (and publishes its BlockStored event) in
// the scheduler step that filled it: a block is matchable, and reported to
// KV-event subscribers, as soon as it is computed, not when the whole
// prompt's prefill ends.
func (r *Replica) publish(s *Sequence) {
	bt := s.BlockTokens
	if bt == 0 {
		return
	}
	full := min(len(s.Prefix), min(s.computed, s.PromptTokens)/bt)
	per := bt / r.eng.BlockSize
	if full-len(s.held) > 1 {
		// A large cache waits for memory at each block's slot: read
		// them all first, so that the misses overlap.
		r.warmed += r.kv.index.warm(s.Prefix[len(s.held):full])
	}
	for i := len(s.held); i < full; i++ {
		r.cache(s, s.Prefix[i], per)
	}
}

// cache turns per private blocks of s into the cache entry h, sharing the
// entry if another sequence cached it meanwhile, and holds it for s.
func (r *Replica) cache(s *Sequence, h uint64, per int) {
	e := r.kv.lookup(h)
	if e != 0 {
		r.kv.acquire(e)
		r.kv.release(per)
	} else {
		e = r.kv.insert(h, per)
	}
	s.private -= int32(per)
	s.shared += int32(per)
	s.held = append(s.held, e)
}

// publishReply moves the blocks of s's Reply into the prefix cache as s
// completes, as far as its private blocks hold them: the KV of the output
// stays cached for a conversation's next turn.
func (r *Replica) publishReply(s *Sequence) {
	bt := s.BlockTokens
	if bt == 0 || len(s.Reply) == 0 || len(s.held) < min(len(s.Prefix), s.PromptTokens/bt) {
		return // the prompt's blocks are not all cached: the chain is broken
	}
	per := bt / r.eng.BlockSize
	for _, h := range s.Reply {
		if int(s.private) < per {
			break
		}
		r.cache(s, h, per)
	}
}

// complete caches the reply of s, which emitted its last token, and frees
// its blocks.
func (r *Replica) complete(s *Sequence) {
	r.publishReply(s)
	r.releaseBlocks(s)
	s.held = nil
	s.state = StateDone
}

// State returns the sequence's state, one of the State constants.
func (s *Sequence) State() uint8 { return s.state }

// Refuse marks a sequence that was never submitted as refused by admission
// control.
func (s *Sequence) Refuse() { s.state = StateRefused }

// Reject marks a sequence that was never submitted as rejected: it can never
// fit in a replica's KV cache.
func (s *Sequence) Reject() { s.state = StateRejected }

// SetRemote marks a sequence, before Submit, whose prompt is prefilled on
// another replica: admitted, it takes KV blocks for its whole prompt and
// waits in the receiving sequences until [Replica.Receive].
func (s *Sequence) SetRemote() { s.remote = true }

// Target returns the tokens to prefill: the prompt, plus the output decoded
// so far after a preemption.
func (s *Sequence) Target() int { return s.target }

// Computed returns the tokens prefilled so far, those from the cache
// included.
func (s *Sequence) Computed() int { return s.computed }

// Decoded returns the tokens appended by decode steps since the last
// prefill.
func (s *Sequence) Decoded() int { return s.decoded }

// Cached returns the prompt tokens served from the prefix cache at the
// sequence's first admission.
func (s *Sequence) Cached() int { return s.cached }

// Waiting returns the waiting queue, oldest first. The caller must not
// change it.
func (r *Replica) Waiting() []*Sequence { return r.waiting[r.whead:] }

// Running returns the running batch, each sequence's progress up to date.
// The caller must not change it.
func (r *Replica) Running() []*Sequence {
	for i := range r.lanes {
		if ln := &r.lanes[i]; ln.left > 0 {
			settle(r.running[i], ln)
		}
	}
	return r.running
}

// NumRunning returns the number of sequences in the running batch.
func (r *Replica) NumRunning() int { return len(r.running) }

// NumReceiving returns the remote sequences admitted whose KV has not
// arrived.
func (r *Replica) NumReceiving() int { return len(r.receiving) }

// Started returns the remote sequences admitted since the last call of
// ClearStarted, whose KV transfers the caller starts.
func (r *Replica) Started() []*Sequence { return r.started }

// ClearStarted forgets the sequences Started returned.
func (r *Replica) ClearStarted() {
	clear(r.started)
	r.started = r.started[:0]
}

// KVUsed and KVTotal return the KV blocks held by sequences and the
// capacity; KVUsage is their ratio.
func (r *Replica) KVUsed() int { return r.kv.used }

// KVTotal returns the KV capacity in blocks.
func (r *Replica) KVTotal() int { return r.kv.total }

// KVUsage returns the share of the KV blocks held by sequences.
func (r *Replica) KVUsage() float64 { return float64(r.kv.used) / float64(r.kv.total) }

// CheckIdle returns an error if the replica, all of whose sequences ended,
// still holds a sequence or a KV block, or its cache accounting is broken.
func (r *Replica) CheckIdle() error {
	if r.kv.used != 0 || r.kv.evictable < 0 || r.kv.evictable > r.kv.total || len(r.running) != 0 || r.NumWaiting() != 0 || len(r.receiving) != 0 {
		return fmt.Errorf("sim: internal error: replica ended with %d blocks used, %d evictable, %d running, %d waiting, %d receiving",
			r.kv.used, r.kv.evictable, len(r.running), r.NumWaiting(), len(r.receiving))
	}
	return nil
}

// CachedHashes returns the chained hashes of the blocks in the prefix cache,
// in no particular order.
func (r *Replica) CachedHashes() iter.Seq[uint64] {
	return r.kv.index.all
}
