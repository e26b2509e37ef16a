package signals

import (
	"fmt"
	"math"
	"strings"
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
	// MaxKeys bounds the number of endpoints held. Recording a new key
	// when the store holds MaxKeys evicts an endpoint that has not been
	// recorded lately: going round the endpoints in turn, the first not
	// recorded again since it was added or the eviction last passed it
	// (the CLOCK approximation of the one recorded least recently).
	// Endpoints that stopped reporting (pods that left) so make room for
	// new ones: one that stops is evicted before 2*MaxKeys further
	// endpoints are added to the full store. When every endpoint held was
	// recorded again since the eviction last passed it, the eviction
	// clears them all and takes the next, which may be one still
	// reporting: size MaxKeys above the endpoints that report at once.
	// 0 means [DefaultMaxKeys].
	MaxKeys int
	// MaxAge, if positive, makes Load report no observation for an endpoint
	// whose newest observation is older than MaxAge, or stamped more than
	// MaxAge ahead of the Clock (taken before the clock stepped back, or by
	// a recorder whose clock is ahead), as the balancer judges its signal.
	// 0 leaves expiry to the consumer (the balancer ignores observations
	// older than its own maximum signal age). MaxAge also bounds the age
	// of the values an ORCA report leaves in place (see [Store]); 0 means
	// [llmlb.DefaultMaxSignalAge] there.
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
// The newest wins field by field, so that one Store can take both scrapes
// and ORCA reports of an endpoint. A full observation ([Store.Record],
// [Store.RecordObservation], a [Scraper]'s) sets every field, except those
// that a newer report set. An ORCA report ([Store.RecordOrca],
// [Store.RecordResponse]) sets only the fields its [OrcaMapping] finds in
// it (vLLM's carries KV usage and waiting requests, not running ones), if
// they are newer than the held ones. The others keep their value, from the
// last full observation or an earlier report, if it was recorded at most
// StoreConfig.MaxAge ([llmlb.DefaultMaxSignalAge] if 0) before the report;
// an older value is dropped (counts to 0, KV usage and engine counters to
// NaN, adapters to nil, Asleep to false), so that reports alone never keep
// a stale scrape alive. The observation's At is the time of the newest
// record merged into it.
//
// A zero Store is ready to use with the defaults of [StoreConfig]. A Store is
// safe for concurrent use by multiple goroutines; Load takes no lock and does
// not allocate. Adding an endpoint takes a lock, and time independent of the
// endpoints held (amortized when full: the eviction passes over an endpoint
// once for each time it was recorded).
type Store struct {
	cfg StoreConfig
	m   sync.Map     // key -> *entry
	n   atomic.Int64 // entries in m; written under mu
	// adds counts the entries added, after each is in m: a loader that
	// missed its key at a count looks again only once it moved.
	adds atomic.Uint64
	mu   sync.Mutex // serializes adding and removing entries, and guards:
	// ring holds every entry in m at its slot; nil slots are listed in
	// free. The eviction's hand goes round it.
	ring []*entry
	free []int32
	hand int
}

type entry struct {
	obs atomic.Pointer[held] // never nil once the entry is in m; never modified
	// gone is set when the entry leaves m: goneDeleted by Delete,
	// goneEvicted to make room for another endpoint.
	gone atomic.Uint32
	// used is set by every record and cleared by the eviction's hand
	// passing over the entry.
	used atomic.Bool
	key  string
	slot int32 // in Store.ring
}

const (
	goneDeleted = 1 + iota
	goneEvicted
)

// held is an endpoint's observation as a Store holds it: the merge of the
// full observations and ORCA reports recorded, with the time of each part.
type held struct {
	Observation
	// full is the time of the full observation the fields no report set
	// come from; zero if there is none (or it was dropped as too old).
	full time.Time
	// at is, for each field a report may set, the time of the record its
	// value comes from; zero if none.
	at [numFields]time.Time
}

// The fields of a Load that an ORCA report may set, as bits of a mask.
const (
	fRunning = iota
	fWaiting
	fKVUsage
	fKVBlocks
	fBlockSize
	numFields
)

const allFields = 1<<numFields - 1

// copyField copies field f of src into dst.
func copyField(dst, src *llmlb.Load, f int) {
	switch f {
	case fRunning:
		dst.Running = src.Running
	case fWaiting:
		dst.Waiting = src.Waiting
	case fKVUsage:
		dst.KVUsage = src.KVUsage
	case fKVBlocks:
		dst.KVBlocks = src.KVBlocks
	case fBlockSize:
		dst.BlockSize = src.BlockSize
	}
}

// unknown is the value of every field with no record.
var unknown = Observation{
	Load:        llmlb.Load{KVUsage: math.NaN()},
	Preemptions: math.NaN(), PrefixQueries: math.NaN(), PrefixHits: math.NaN(),
}

// keeps reports whether a held value recorded at was wins over one
// recorded at at: it is newer, and not ahead of the store's clock (after
// the clock stepped back, or when a caller stamped it in the future, it
// would otherwise keep out every record until the clock caught up with it).
func (s *Store) keeps(was, at time.Time) bool {
	return was.After(at) && !was.After(s.now())
}

// carry is how long a value a report does not set is kept.
func (s *Store) carry() time.Duration {
	if s.cfg.MaxAge > 0 {
		return s.cfg.MaxAge
	}
	return llmlb.DefaultMaxSignalAge
}

// merge returns what the store holds after recording o over old (nil if
// none): a full observation if set is allFields and full is true, else a
// report of the fields in set. It returns nil if o changes nothing, being
// older than what old holds.
func (s *Store) merge(old *held, o *Observation, set uint8, full bool) *held {
	if full && old != nil && s.keeps(old.full, o.At) {
		return nil // a newer full observation is held
	}
	n := &held{}
	if full {
		n.Observation, n.full = *o, o.At
		for f := range numFields {
			n.at[f] = o.At
			if old != nil && !old.at[f].IsZero() && s.keeps(old.at[f], o.At) {
				// A report newer than this observation.
				copyField(&n.Load, &old.Load, f)
				n.at[f] = old.at[f]
			}
		}
	} else {
		if old == nil {
			n.Observation = unknown
		} else {
			*n = *old
		}
		changed := false
		for f := range numFields {
			if set&(1<<f) == 0 || (old != nil && s.keeps(old.at[f], o.At)) {
				continue
			}
			copyField(&n.Load, &o.Load, f)
			n.at[f], changed = o.At, true
		}
		if !changed {
			return nil
		}
		// Values carried from records too much older than the report
		// are dropped: reports alone do not keep them.
		oldest := o.At.Add(-s.carry())
		for f := range numFields {
			if !n.at[f].IsZero() && n.at[f].Before(oldest) {
				copyField(&n.Load, &unknown.Load, f)
				n.at[f] = time.Time{}
			}
		}
		if !n.full.IsZero() && n.full.Before(oldest) {
			// Every field but the reportable ones comes from the full
			// observation.
			keep := n.Load
			n.Observation = unknown
			for f := range numFields {
				copyField(&n.Load, &keep, f)
			}
			n.full = time.Time{}
		}
	}
	n.At = n.full
	for _, t := range n.at {
		if t.After(n.At) {
			n.At = t
		}
	}
	return n
}

// testHookUpdate, if set, runs in RecordObservation before it updates an
// entry it found; tests use it to evict the entry meanwhile.
var testHookUpdate func(*Store, string)

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
// is set and the observation is older than it (or that far ahead of the
// clock).
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
	var (
		cur    atomic.Pointer[entry]
		missed atomic.Uint64 // 1 + adds when key was last looked up and absent
	)
	return func() *llmlb.Load {
		e := cur.Load()
		if e == nil || e.gone.Load() != 0 {
			adds := s.adds.Load()
			if missed.Load() == adds+1 {
				return nil // nothing was added since key was found absent
			}
			if e = s.entry(key); e == nil {
				missed.Store(adds + 1)
				return nil
			}
			cur.Store(e)
		}
		o := e.obs.Load() // never modified once recorded
		if s.cfg.MaxAge > 0 && !fresh(s.now(), o.At, s.cfg.MaxAge) {
			return nil
		}
		return &o.Observation.Load
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
	if s.cfg.MaxAge > 0 && !fresh(s.now(), o.At, s.cfg.MaxAge) {
		return nil
	}
	return &o.Observation
}

// fresh reports whether an observation taken at at is within maxAge of now,
// either way: one stamped further ahead is no fresher than one that old.
// Were it trusted, an observation taken before the clock stepped back would
// be served as fresh for the step's length, whether or not anything still
// refreshes it.
func fresh(now, at time.Time, maxAge time.Duration) bool {
	age := now.Sub(at)
	return age <= maxAge && age >= -maxAge
}

// Record records l as a full observation of the endpoint key unless the
// store holds a newer one (by At) that is not ahead of the store's clock;
// an observation at the same time replaces the held one, except for the
// fields a newer ORCA report set (see [Store]). It fails with
// [ErrInvalidLoad] for an empty key or an invalid load (zero At, negative
// counts, KV usage outside [0, 1] and not NaN), and never for a full store:
// a new key then evicts one not recorded lately (see StoreConfig.MaxKeys).
func (s *Store) Record(key string, l llmlb.Load) error {
	return s.RecordObservation(key, observationOf(l))
}

// RecordObservation is like Record for a full observation. It also fails
// with [ErrInvalidLoad] for engine counters (Preemptions, PrefixQueries,
// PrefixHits) that are negative or above 1e18, as a scrape's are checked
// ([Parse]), and for PrefixHits above PrefixQueries, which no engine
// reports; NaN means not reported.
func (s *Store) RecordObservation(key string, o Observation) error {
	return s.record(key, &o, allFields, true)
}

// record merges o into key's observation: a full observation if full, else
// a report of the fields in set.
func (s *Store) record(key string, p *Observation, set uint8, full bool) error {
	if err := validate(key, p); err != nil {
		return err
	}
	if set == 0 {
		return nil // a report of nothing
	}
	// A record that finds its entry evicted, before or after updating it,
	// is made again in a new entry; up to three times, as evictions race
	// with it only while other endpoints are added. (One that updates an
	// entry just as it is evicted is lost: its endpoint's next report
	// adds it again.)
	for range 3 {
		e := s.entry(key)
		if e == nil || e.gone.Load() == goneEvicted {
			if e = s.insert(key, s.merge(nil, p, set, full)); e == nil {
				return nil // inserted
			}
		}
		if testHookUpdate != nil {
			testHookUpdate(s, key)
		}
		if !e.used.Load() {
			e.used.Store(true)
		}
		if !s.update(e, p, set, full) || e.gone.Load() != goneEvicted {
			return nil
		}
	}
	return nil
}

// update merges p into e (see merge); it reports whether that changed e.
func (s *Store) update(e *entry, p *Observation, set uint8, full bool) bool {
	for {
		old := e.obs.Load()
		n := s.merge(old, p, set, full)
		if n == nil {
			return false
		}
		if e.obs.CompareAndSwap(old, n) {
			return true
		}
	}
}

func (s *Store) entry(key string) *entry {
	if v, ok := s.m.Load(key); ok {
		return v.(*entry)
	}
	return nil
}

// insert adds key with p, evicting an endpoint not recorded lately if the
// store is full. If another goroutine inserted key first, it returns that
// entry for the caller to update.
func (s *Store) insert(key string, p *held) *entry {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e := s.entry(key); e != nil {
		return e
	}
	if s.n.Load() >= s.maxKeys() {
		s.evictLocked()
	}
	// A new entry is not marked used: an endpoint recorded once, and not
	// since, is evicted before those recorded again.
	e := &entry{key: strings.Clone(key)}
	e.obs.Store(p)
	if n := len(s.free); n > 0 {
		e.slot = s.free[n-1]
		s.free = s.free[:n-1]
		s.ring[e.slot] = e
	} else {
		e.slot = int32(len(s.ring))
		s.ring = append(s.ring, e)
	}
	s.m.Store(e.key, e)
	s.n.Add(1)
	s.adds.Add(1)
	return nil
}

// evictLocked removes an endpoint not recorded since the hand last passed
// it: going round the ring from the hand, it clears the used mark of each
// entry it passes and evicts the first without one. Records running
// meanwhile mark entries again; after two turns it evicts the entry at the
// hand whatever its mark.
func (s *Store) evictLocked() {
	if s.n.Load() == 0 {
		return
	}
	for step := 0; ; step++ {
		if s.hand >= len(s.ring) {
			s.hand = 0
		}
		e := s.ring[s.hand]
		s.hand++
		if e == nil {
			continue
		}
		if e.used.Load() && step < 2*len(s.ring) {
			e.used.Store(false)
			continue
		}
		e.gone.Store(goneEvicted) // first: see RecordObservation
		s.removeLocked(e)
		return
	}
}

// removeLocked takes e out of the store.
func (s *Store) removeLocked(e *entry) {
	s.m.Delete(e.key)
	s.n.Add(-1)
	s.ring[e.slot] = nil
	s.free = append(s.free, e.slot)
}

// Delete forgets the endpoint key. It is a no-op for an unknown key. A later
// Record for key adds it again.
func (s *Store) Delete(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e := s.entry(key); e != nil {
		s.removeLocked(e)
		e.gone.Store(goneDeleted)
	}
}

// Len returns the number of endpoints held.
func (s *Store) Len() int { return int(s.n.Load()) }

// validate checks the observation o of key. The engine counters, like KV
// usage, may be NaN: not reported.
func validate(key string, o *Observation) error {
	l := &o.Load
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
	case badCounter(o.Preemptions) || badCounter(o.PrefixQueries) || badCounter(o.PrefixHits):
		return fmt.Errorf("%w: %q: engine counter negative or above %v (preemptions %v, prefix queries %v, prefix hits %v)",
			ErrInvalidLoad, key, maxCounter, o.Preemptions, o.PrefixQueries, o.PrefixHits)
	case o.PrefixHits > o.PrefixQueries: // false when either is NaN
		return fmt.Errorf("%w: %q: prefix hits %v exceed prefix queries %v",
			ErrInvalidLoad, key, o.PrefixHits, o.PrefixQueries)
	}
	return nil
}

// badCounter reports whether v cannot be a cumulative count (negative, or
// above the bound a scrape's counters are held to, infinity included), nor
// NaN for one not reported.
func badCounter(v float64) bool { return v < 0 || v > maxCounter }
