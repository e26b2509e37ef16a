package signals

import (
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/internal/stamped"
)

// DefaultMaxKeys is the number of endpoints a [Store] holds when
// StoreConfig.MaxKeys is 0.
const DefaultMaxKeys = 65536

// StoreConfig configures a [Store]. The zero value is valid: every field's
// zero value is a documented default.
type StoreConfig struct {
	// MaxKeys bounds the number of endpoints held; recording a new key
	// beyond it fails with [ErrTooManyKeys]. 0 means [DefaultMaxKeys].
	MaxKeys int
	// MaxAge, if positive, makes Load report no observation for an endpoint
	// whose newest observation is older than MaxAge. 0 leaves expiry to the
	// consumer (the balancer ignores observations older than its own
	// maximum signal age).
	MaxAge time.Duration
	// Clock tells the time for MaxAge; nil means the system clock.
	Clock llmlb.Clock
}

// Store holds the newest observation of each endpoint. Anyone may record an
// observation (from a metrics scrape, an ORCA header, a gRPC trailer, an
// engine event); the newest by observation time wins, so an older
// observation arriving late never replaces a newer one, unless the newer
// one is stamped ahead of the store's clock (the clock stepped back, or its
// recorder's clock is ahead): any observation then replaces it. Store
// implements [llmlb.Signal].
//
// A zero Store is ready to use with the defaults of [StoreConfig]. A Store is
// safe for concurrent use by multiple goroutines; Load takes no lock and does
// not allocate.
type Store struct {
	cfg StoreConfig
	mu  sync.Mutex                        // serializes writers of m
	m   atomic.Pointer[map[string]*entry] // copy-on-write; nil means empty
}

type entry struct {
	obs  atomic.Pointer[Observation] // never nil once the entry is in m
	gone atomic.Bool                 // set when Delete takes the entry out of m
}

// NewStore returns a Store configured by cfg.
func NewStore(cfg StoreConfig) (*Store, error) {
	if cfg.MaxKeys < 0 {
		return nil, fmt.Errorf("%w: StoreConfig.MaxKeys %d is negative", ErrInvalidConfig, cfg.MaxKeys)
	}
	if cfg.MaxAge < 0 {
		return nil, fmt.Errorf("%w: StoreConfig.MaxAge %v is negative", ErrInvalidConfig, cfg.MaxAge)
	}
	return &Store{cfg: cfg}, nil
}

func (s *Store) maxKeys() int64 {
	if s.cfg.MaxKeys == 0 {
		return DefaultMaxKeys
	}
	return int64(s.cfg.MaxKeys)
}

func (s *Store) now() time.Time {
	if s.cfg.Clock == nil {
		return time.Now()
	}
	return s.cfg.Clock.Now()
}

// Load returns the newest observation of the endpoint key, implementing
// [llmlb.Signal]. It reports false if there is none, or if StoreConfig.MaxAge
// is set and the observation is older than it.
func (s *Store) Load(key string) (llmlb.Load, bool) {
	if o := s.observation(key); o != nil {
		return o.Load, true
	}
	return llmlb.Load{}, false
}

// Loader is for the balancers of this module, which alone can name its
// first argument: it returns a function that returns key's observation as
// Load would, or nil, without looking key up again once the store holds
// it, and without copying it. The observation must not be modified.
func (s *Store) Loader(_ stamped.Token, key string) func() *llmlb.Load {
	var cur atomic.Pointer[entry]
	return func() *llmlb.Load {
		e := cur.Load()
		if e == nil || e.gone.Load() {
			if e = s.entry(key); e == nil {
				return nil
			}
			cur.Store(e)
		}
		o := e.obs.Load() // never modified once recorded
		if s.cfg.MaxAge > 0 && s.now().Sub(o.At) > s.cfg.MaxAge {
			return nil
		}
		return &o.Load
	}
}

// Observation is like Load but returns the full observation.
func (s *Store) Observation(key string) (Observation, bool) {
	if o := s.observation(key); o != nil {
		return *o, true
	}
	return Observation{}, false
}

// observation returns the held observation of key, or nil if there is none
// or StoreConfig.MaxAge is set and it is older. The observation is shared:
// do not modify it.
func (s *Store) observation(key string) *Observation {
	e := s.entry(key)
	if e == nil {
		return nil
	}
	o := e.obs.Load()
	if s.cfg.MaxAge > 0 && s.now().Sub(o.At) > s.cfg.MaxAge {
		return nil
	}
	return o
}

// Record records l as an observation of the endpoint key unless the store
// holds a newer one (by At) that is not ahead of the store's clock; an
// observation at the same time replaces the held one. It fails with [ErrInvalidLoad] for an empty key or an invalid
// load (zero At, negative counts, KV usage outside [0, 1] and not NaN), and
// with [ErrTooManyKeys] for a new key when the store is full.
func (s *Store) Record(key string, l llmlb.Load) error {
	return s.RecordObservation(key, observationOf(l))
}

// RecordObservation is like Record for a full observation.
func (s *Store) RecordObservation(key string, o Observation) error {
	if err := validate(key, &o.Load); err != nil {
		return err
	}
	p := &o
	e := s.entry(key)
	if e == nil {
		var err error
		if e, err = s.insert(key, p); e == nil || err != nil {
			return err // inserted, or failed
		}
	}
	for {
		old := e.obs.Load()
		// The held observation wins if it is newer, unless it is stamped
		// ahead of the clock: after the clock stepped back, or when a
		// caller stamped it in the future, it would otherwise keep out
		// every observation until the clock caught up with it.
		if old.At.After(o.At) && !old.At.After(s.now()) {
			return nil
		}
		if e.obs.CompareAndSwap(old, p) {
			return nil
		}
	}
}

func (s *Store) entry(key string) *entry {
	if m := s.m.Load(); m != nil {
		return (*m)[key]
	}
	return nil
}

// insert adds key with p. If another goroutine inserted key first, it
// returns that entry for the caller to update.
func (s *Store) insert(key string, p *Observation) (*entry, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var old map[string]*entry
	if m := s.m.Load(); m != nil {
		old = *m
	}
	if e := old[key]; e != nil {
		return e, nil
	}
	if int64(len(old)) >= s.maxKeys() {
		return nil, fmt.Errorf("%w: store holds %d endpoints; cannot add %q", ErrTooManyKeys, s.maxKeys(), key)
	}
	m := make(map[string]*entry, len(old)+1)
	for k, v := range old {
		m[k] = v
	}
	e := new(entry)
	e.obs.Store(p)
	m[key] = e
	s.m.Store(&m)
	return nil, nil
}

// Delete forgets the endpoint key. It is a no-op for an unknown key. A later
// Record for key adds it again.
func (s *Store) Delete(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	old := s.m.Load()
	if old == nil || (*old)[key] == nil {
		return
	}
	m := make(map[string]*entry, len(*old))
	for k, v := range *old {
		if k != key {
			m[k] = v
		}
	}
	s.m.Store(&m)
	(*old)[key].gone.Store(true)
}

// Len returns the number of endpoints held.
func (s *Store) Len() int {
	if m := s.m.Load(); m != nil {
		return len(*m)
	}
	return 0
}
func validate(key string, l *llmlb.Load) error {
	switch {
	case key == "":
		return fmt.Errorf("%w: empty endpoint key", ErrInvalidLoad)
	case l.At.IsZero():
		return fmt.Errorf("%w: %q: zero observation time", ErrInvalidLoad, key)
	case l.Running < 0 || l.Waiting < 0 || l.KVBlocks < 0 || l.BlockSize < 0 || l.MaxAdapters < 0:
		return fmt.Errorf("%w: %q: negative count (running %d, waiting %d, KV blocks %d, block size %d)",
			ErrInvalidLoad, key, l.Running, l.Waiting, l.KVBlocks, l.BlockSize)
	case !math.IsNaN(l.KVUsage) && !(l.KVUsage >= 0 && l.KVUsage <= 1):
		return fmt.Errorf("%w: %q: KV usage %v outside [0, 1]", ErrInvalidLoad, key, l.KVUsage)
	}
	return nil
}
