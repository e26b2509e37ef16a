package sim

import (
	"time"

	"github.com/llmlb/llmlb"
)

// Request states.
const (
	statePending  uint8 = iota // not yet arrived or in flight to its replica
	stateWaiting               // in a replica's waiting queue
	stateRunning               // in a replica's running batch
	stateDone                  // finished
	stateRejected              // can never fit in the replica's KV cache
)

// reqState is the progress of one request through a replica.
type reqState struct {
	req     *Request
	pick    llmlb.Pick
	replica int
	state   uint8

	target    int // tokens to prefill: the prompt, plus output on recompute
	computed  int // tokens prefilled so far (including those from cache)
	decoded   int // tokens appended by decode steps since the last prefill
	generated int // output tokens emitted
	chunk     int // tokens scheduled in the current iteration

	private int      // KV blocks owned by this sequence alone
	shared  int      // KV blocks of held cache entries
	held    []*entry // referenced cache entries, in prefix order

	admitted    bool // admitted at least once (cache hit counted)
	cached      int  // prompt tokens served from cache at first admission
	preemptions int

	firstToken time.Duration // simulated time of the first output token
	finished   time.Duration
}

// replica is one continuous-batching engine.
type replica struct {
	idx    int
	eng    *Engine
	kv     *kvPool
	run    *runner
	wmark  int // watermark blocks kept free when admitting
	busy   bool
	iterAt time.Duration

	waiting []*reqState // FIFO from whead
	whead   int
	running []*reqState

	outstanding int // requests dispatched here and not finished
	assigned    int
	preemptions int
}

func newReplica(idx int, eng *Engine, run *runner) *replica {
	return &replica{
		idx:   idx,
		eng:   eng,
		kv:    newKVPool(eng.KVBlocks),
		run:   run,
		wmark: eng.KVBlocks / 100,
	}
}

func (r *replica) blocksFor(tokens int) int {
	return (tokens + r.eng.BlockSize - 1) / r.eng.BlockSize
}

// fits reports whether a request can ever run on this replica: its prompt
// and output together fit in the KV cache.
func (r *replica) fits(req *Request) bool {
	return r.blocksFor(req.PromptTokens+req.OutputTokens) <= r.kv.total
}

func (r *replica) nwaiting() int { return len(r.waiting) - r.whead }

// enqueue appends a newly arrived request to the waiting queue.
func (r *replica) enqueue(s *reqState, now time.Duration) {
	s.state = stateWaiting
	s.target = s.req.PromptTokens
	r.waiting = append(r.waiting, s)
	r.kick(now)
}

func (r *replica) pushFront(s *reqState) {
	s.state = stateWaiting
	if r.whead > 0 {
		r.whead--
		r.waiting[r.whead] = s
		return
	}
	r.waiting = append(r.waiting, nil)
	copy(r.waiting[1:], r.waiting)
	r.waiting[0] = s
}

func (r *replica) popFront() {
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

// kick starts an iteration if the engine is idle and has work.
func (r *replica) kick(now time.Duration) {
	if r.busy {
		return
	}
	b, ok := r.plan()
	if !ok {
		return
	}
	d := r.eng.IterTime(b)
	if d <= 0 {
		d = time.Nanosecond
	}
	r.busy = true
	r.iterAt = now + d
	r.run.schedule(r.iterAt, evIteration, r.idx)
}

// plan schedules the next iteration: every running sequence gets its next
// prefill chunk or one decode token within the token budget, KV blocks are
// allocated for them (preempting the newest running sequences when the cache
// is full), and waiting requests are admitted in order while budget, batch
// slots and KV blocks last.
func (r *replica) plan() (Batch, bool) {
	budget := r.eng.TokenBudget
	var b Batch
	preempted := false
	for i := 0; i < len(r.running); i++ {
		s := r.running[i]
		s.chunk = 0
		if budget == 0 {
			continue
		}
		n := 1
		if s.computed < s.target {
			n = min(s.target-s.computed, budget)
		}
		need := r.blocksFor(s.computed+s.decoded+n) - s.private - s.shared
		victim := false
		for !r.kv.alloc(need) {
			last := len(r.running) - 1
			v := r.running[last]
			r.running = r.running[:last]
			r.preempt(v)
			preempted = true
			if v == s {
				victim = true
				break
			}
		}
		if victim {
			break
		}
		s.private += max(need, 0)
		s.chunk = n
		budget -= n
		if s.computed < s.target {
			b.PrefillTokens += n
		} else {
			b.DecodeSeqs++
		}
	}
	for !preempted && budget > 0 && r.nwaiting() > 0 && len(r.running) < r.eng.MaxRunning {
		s := r.waiting[r.whead]
		r.match(s)
		n := min(s.target-s.computed, budget)
		need := r.blocksFor(s.computed+n) - s.shared
		reserve := 0
		if len(r.running) > 0 {
			reserve = r.wmark
		}
		if r.kv.available()-need < reserve || !r.kv.alloc(need) {
			r.releaseBlocks(s)
			break
		}
		r.popFront()
		if !s.admitted {
			s.admitted = true
			s.cached = s.computed
		}
		s.private = need
		s.chunk = n
		s.state = stateRunning
		r.running = append(r.running, s)
		budget -= n
		b.PrefillTokens += n
	}
	b.KVUsage = float64(r.kv.used) / float64(r.kv.total)
	return b, b.PrefillTokens+b.DecodeSeqs > 0
}

// match references the cached prefix of s and counts it as computed. At
// least one prompt token is always left to compute.
func (r *replica) match(s *reqState) {
	req := s.req
	bt := req.BlockTokens
	if bt == 0 || len(req.Prefix) == 0 {
		return
	}
	maxBlocks := min(len(req.Prefix), (s.target-1)/bt)
	per := bt / r.eng.BlockSize
	for i := 0; i < maxBlocks; i++ {
		e := r.kv.lookup(req.Prefix[i])
		if e == nil {
			break
		}
		r.kv.acquire(e)
		s.held = append(s.held, e)
		s.shared += per
	}
	s.computed = len(s.held) * bt
}

// matchTokens returns how many prompt tokens of req this replica's cache
// holds now, without touching the cache.
func (r *replica) matchTokens(req *Request) int {
	bt := req.BlockTokens
	if bt == 0 || len(req.Prefix) == 0 {
		return 0
	}
	maxBlocks := min(len(req.Prefix), (req.PromptTokens-1)/bt)
	n := 0
	for n < maxBlocks && r.kv.lookup(req.Prefix[n]) != nil {
		n++
	}
	return n * bt
}

// releaseBlocks frees every KV block of s and resets its progress. Cache
// entries are released last block first, so the head of a prefix, shared
// most widely, is evicted last.
func (r *replica) releaseBlocks(s *reqState) {
	for i := len(s.held) - 1; i >= 0; i-- {
		r.kv.unref(s.held[i])
		s.held[i] = nil
	}
	s.held = s.held[:0]
	r.kv.release(s.private)
	s.private, s.shared, s.computed, s.decoded, s.chunk = 0, 0, 0, 0, 0
}

// preempt frees s's blocks and puts it back at the head of the waiting
// queue; it will recompute its prompt and the output generated so far.
func (r *replica) preempt(s *reqState) {
	r.releaseBlocks(s)
	s.target = s.req.PromptTokens + s.generated
	s.preemptions++
	r.preemptions++
	r.pushFront(s)
}

// finish completes the iteration that ends at now: prefill chunks advance,
// finished prefills publish their prompt blocks to the prefix cache and emit
// a token, decoding sequences emit a token, and finished requests leave.
func (r *replica) finish(now time.Duration) {
	r.busy = false
	keep := r.running[:0]
	for _, s := range r.running {
		if s.chunk > 0 {
			if s.computed < s.target {
				s.computed += s.chunk
				if s.computed == s.target {
					r.publish(s)
					r.emit(s, now)
				}
			} else {
				s.decoded++
				r.emit(s, now)
			}
			s.chunk = 0
		}
		if s.state == stateDone {
			continue
		}
		keep = append(keep, s)
	}
	clear(r.running[len(keep):])
	r.running = keep
	r.kick(now)
}

// publish moves the full prompt blocks of s beyond its cached prefix into the
// prefix cache, sharing an entry another sequence published meanwhile.
func (r *replica) publish(s *reqState) {
	req := s.req
	bt := req.BlockTokens
	if bt == 0 {
		return
	}
	full := min(len(req.Prefix), req.PromptTokens/bt)
	per := bt / r.eng.BlockSize
	for i := len(s.held); i < full; i++ {
		h := req.Prefix[i]
		e := r.kv.lookup(h)
		if e != nil {
			r.kv.acquire(e)
			r.kv.release(per)
		} else {
			e = r.kv.insert(h, per)
		}
		s.private -= per
		s.shared += per
		s.held = append(s.held, e)
	}
}

func (r *replica) emit(s *reqState, now time.Duration) {
	s.generated++
	if s.generated == 1 {
		s.firstToken = now
		s.pick.FirstToken()
	}
	if s.generated >= s.req.OutputTokens {
		r.releaseBlocks(s)
		s.held = nil
		s.state = stateDone
		s.finished = now
		r.outstanding--
		s.pick.Done(nil)
		r.run.finished(s)
	}
}
