package kvevents

import (
	"fmt"
	"sync"

	"github.com/llmlb/llmlb/prefix"
)

// Applier applies engine batches that reach the router by some means other
// than a Subscriber's own connection to a [prefix.Index], as a Subscriber
// applies them: each BlockStored translated into the router's hashes with
// the endpoint's salt, each BlockRemoved and AllBlocksCleared applied, per
// endpoint in sequence order. Its Apply method has the shape of
// [Config].Forward: a Subscriber that forwards to it indexes as one with an
// Index does, and a relay (package share's carries batches over NATS) can
// stand between the two.
//
// An Applier cannot ask for a replay, so a gap in an endpoint's sequence
// numbers, a sequence that goes back (the engine restarted), a clear (a
// nil payload) or a batch that does not decode drops the endpoint's
// blocks: what it holds is then unknown, and is never guessed; the blocks
// stored after that are indexed again. Blocks stored before the first
// batch it receives are not known to it until the engine stores them again.
//
// Only the endpoints given to SetEndpoints are applied, so memory is bounded
// by them (MaxBlocks map entries each) and one decoded batch, whatever is
// received. Its methods are safe for concurrent use. The zero Applier is
// not usable; create one with [NewApplier].
type Applier struct {
	cfg Config

	mu    sync.Mutex // protects eps, the state of each endpoint, and batch
	eps   map[string]*applied
	batch Batch // decoding storage, shared by every endpoint
}

// applied is the state of one endpoint.
type applied struct {
	salt  prefix.Salt
	tr    *translator
	stats counters
	last  int64 // last batch applied, -1 if none
}

// NewApplier returns an Applier that indexes into cfg.Index with
// cfg.Hasher, bounded by cfg.MaxBlocks per endpoint, and reports malformed
// batches to cfg.OnError. Index and Hasher are required; the connection
// settings and Forward are not used. It returns an error wrapping
// [ErrInvalidConfig] for a config a Subscriber would refuse.
func NewApplier(cfg Config) (*Applier, error) {
	if err := checkIndex(&cfg); err != nil {
		return nil, err
	}
	return &Applier{cfg: cfg, eps: make(map[string]*applied)}, nil
}

// SetEndpoints replaces the endpoints applied, keyed by the endpoint keys
// the batches come with (the balancer's), each with the salt the router
// hashes that engine's prompts with (see [Endpoint].Salt). An endpoint
// removed, or whose salt changes, has its blocks dropped from the index. It
// returns an error wrapping [ErrInvalidConfig], changing nothing, if a key
// is empty.
func (a *Applier) SetEndpoints(eps map[string]prefix.Salt) error {
	for k := range eps {
		if k == "" {
			return fmt.Errorf("%w: empty endpoint key", ErrInvalidConfig)
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for k, ap := range a.eps {
		if salt, ok := eps[k]; !ok || salt != ap.salt {
			delete(a.eps, k)
			a.cfg.Index.RemoveEndpoint(k)
		}
	}
	for k, salt := range eps {
		if a.eps[k] == nil {
			ap := &applied{salt: salt, last: -1}
			ap.stats.seq.Store(-1)
			ap.tr = newTranslator(k, a.cfg.Index, a.cfg.Hasher, salt, a.cfg.MaxBlocks, &ap.stats)
			a.eps[k] = ap
		}
	}
	return nil
}

// Apply applies batch seq of endpoint key, encoded as the engine published
// it; a nil payload drops the endpoint's blocks (seq is then not read). A
// key not set by SetEndpoints is ignored. A batch that does not decode, or
// a negative seq with a payload, drops the endpoint's blocks and is
// reported to OnError. Apply does not keep payload.
func (a *Applier) Apply(key string, seq int64, payload []byte) {
	// OnError runs outside the lock.
	if err := a.apply(key, seq, payload); err != nil && a.cfg.OnError != nil {
		a.cfg.OnError(key, err)
	}
}

// apply is Apply, without reporting the error of a batch that cannot be
// applied.
func (a *Applier) apply(key string, seq int64, payload []byte) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	ap := a.eps[key]
	switch {
	case ap == nil:
		return nil
	case payload == nil:
		ap.tr.clear()
		ap.last = -1
		return nil
	case seq < 0:
		return a.malformed(ap, fmt.Errorf("%w: sequence number %d", ErrMalformed, seq))
	case ap.last >= 0 && seq <= ap.last:
		ap.tr.clear() // the engine restarted
	case ap.last >= 0 && seq > ap.last+1: // ap.last+1 does not overflow: seq > ap.last
		ap.stats.gaps.Add(1)
		ap.tr.clear()
	}
	ap.last = seq
	ap.stats.seq.Store(seq)
	if err := DecodeBatch(&a.batch, payload); err != nil {
		return a.malformed(ap, fmt.Errorf("kvevents: batch %d: %w", seq, err))
	}
	ap.tr.apply(&a.batch)
	return nil
}

// malformed drops an endpoint's blocks after a batch that cannot be
// applied, and returns err.
func (a *Applier) malformed(ap *applied, err error) error {
	ap.stats.malformed.Add(1)
	ap.tr.clear()
	ap.last = -1
	return err
}

// Clear drops the blocks of every endpoint, as a nil payload for each
// would: for when nothing keeps them current any more, such as a relay's
// subscription ending.
func (a *Applier) Clear() {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, ap := range a.eps {
		ap.tr.clear()
		ap.last = -1
	}
}

// Stats returns the counters of endpoint key, and false if it is not
// applied. Connected, Connects and Replayed stay zero: an Applier has no
// connection.
func (a *Applier) Stats(key string) (Stats, bool) {
	a.mu.Lock()
	ap := a.eps[key]
	a.mu.Unlock()
	if ap == nil {
		return Stats{}, false
	}
	return ap.stats.snapshot(), true
}
