package signals

import (
	"compress/gzip"
	"container/heap"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/internal/stamped"
)

// Defaults for the zero fields of [Config].
const (
	// DefaultInterval is the time between two scrapes of one endpoint.
	DefaultInterval = time.Second
	// DefaultMaxTimeout caps the default per-scrape timeout, which is the
	// interval.
	DefaultMaxTimeout = 5 * time.Second
	// DefaultJitter is the fraction of the interval by which each wait
	// between scrapes is randomly lengthened or shortened.
	DefaultJitter = 0.1
	// DefaultMaxBodyBytes caps a metrics body after decompression. A vLLM
	// exposition is typically 20-100 KiB.
	DefaultMaxBodyBytes = 4 << 20
	// DefaultMaxConcurrent bounds the scrapes in flight at once.
	DefaultMaxConcurrent = 32
	// DefaultMaxRedirects is the number of redirects the default HTTP client
	// follows before failing.
	DefaultMaxRedirects = 3
)

// acceptHeader asks for the Prometheus text format, which expfmt parses in
// linear time, and not for OpenMetrics, whose syntax beyond the text
// format's (exemplars, fractional timestamps) [Parse] refuses.
const acceptHeader = "text/plain;version=0.0.4;q=1,*/*;q=0.1"

// Config configures a [Scraper]. The zero value is valid: every field's zero
// value is a documented default.
type Config struct {
	// Client performs the scrapes. nil means a client of this package's own,
	// with keep-alive connections, at most [DefaultMaxRedirects] redirects
	// and 1 MiB of response headers, that connects directly (no proxy from
	// the environment) with Go's default TLS configuration; its idle
	// connections are closed by Close. Give a Client to scrape through a
	// proxy or with a CA or client certificate of your own. Timeout,
	// MaxBodyBytes and MaxConcurrent bound the scrapes whatever the Client;
	// the Timeout of a caller's client still applies, as does its redirect
	// policy.
	Client *http.Client
	// Interval is the time between two scrapes of one endpoint, at least
	// 1ms. 0 means [DefaultInterval].
	Interval time.Duration
	// Timeout bounds the HTTP exchange of one scrape: connecting, sending
	// the request and reading the whole body. 0 means the Interval, at most
	// [DefaultMaxTimeout].
	Timeout time.Duration
	// Jitter is the fraction, in [0, 1), of the Interval by which each wait
	// between two scrapes of an endpoint is randomly lengthened or
	// shortened, so that scrapes stay spread out. 0 means [DefaultJitter];
	// a negative value disables jitter. Independently of Jitter, each
	// endpoint's first scrape happens at a random phase within the first
	// Interval.
	Jitter float64
	// MaxBodyBytes caps a metrics body, counted after decompression; a
	// larger body fails with [ErrBodyTooLarge] after reading at most
	// MaxBodyBytes+1 bytes. 0 means [DefaultMaxBodyBytes].
	MaxBodyBytes int64
	// MaxConcurrent bounds the scrapes Run keeps in flight at once. 0 means
	// [DefaultMaxConcurrent].
	MaxConcurrent int
	// MaxEndpoints bounds the number of targets. 0 means [DefaultMaxKeys].
	MaxEndpoints int
	// Engine is the metrics dialect of every target; [EngineAuto], the
	// zero value, detects it from each exposition.
	Engine Engine
	// MaxAge, if positive, makes Load report no observation for an endpoint
	// whose newest observation is older than MaxAge, or stamped more than
	// MaxAge ahead of the Clock (see [StoreConfig].MaxAge). 0 leaves expiry
	// to the balancer's maximum signal age.
	MaxAge time.Duration
	// Store receives the observations. nil means a new Store of the
	// scraper's own; pass a shared Store to merge scrapes with pushed
	// observations (ORCA headers, engine events): the newest value of
	// each field wins, and an ORCA report leaves the scraped fields it
	// does not carry in place (see [Store]).
	Store *Store
	// Clock stamps observations and status; nil means the system clock.
	// Run's schedule always follows real time.
	Clock llmlb.Clock
	// Rand draws scrape phases and jitter; nil means a randomly seeded
	// source. The scraper serializes access to it.
	Rand rand.Source
	// OnResult, if set, is called after every scrape of an endpoint, by Run
	// and by Scrape, with the endpoint's status before and after it: a
	// gateway logs failures (cur.LastError, cur.ConsecutiveFailures) and
	// recoveries (prev.ConsecutiveFailures > 0, cur's zero) from it. It
	// is called from the scraping goroutine, outside the scraper's locks,
	// and must not block.
	OnResult func(prev, cur Status)
}

// ScrapeError is the error of one failed scrape. It wraps the cause, which
// is one of this package's sentinels or an error of the HTTP client
// (a timeout, a redirect loop, a refused connection). It is not changed
// after it is returned, so its methods may be called from any goroutine.
type ScrapeError struct {
	Key string // the endpoint key
	URL string // the metrics URL
	Err error  // the cause
}

// Error returns a message naming the endpoint and the cause.
func (e *ScrapeError) Error() string {
	return "signals: scrape of " + e.Key + " (" + e.URL + "): " + strings.TrimPrefix(e.Err.Error(), "signals: ")
}

// Unwrap returns the cause.
func (e *ScrapeError) Unwrap() error { return e.Err }

// Status describes the scraping of one endpoint, for a gateway to export.
type Status struct {
	// Key is the endpoint's key and URL the metrics address scraped.
	Key string
	URL string
	// Engine is the dialect of the last successful scrape.
	Engine Engine
	// LastSuccess is when the last successful scrape was sent; zero if none.
	LastSuccess time.Time
	// LastError is the error of the last failed scrape and LastErrorAt when
	// that scrape was sent; nil and zero if none failed.
	LastError   error
	LastErrorAt time.Time
	// LastDuration is how long the last scrape took, successful or not.
	LastDuration time.Duration
	// ConsecutiveFailures counts the failed scrapes since the last success.
	ConsecutiveFailures int
	// Scrapes and Failures count all scrapes and the failed ones.
	Scrapes  uint64
	Failures uint64
}

// Scraper polls the Prometheus metrics endpoint of each target and keeps the
// newest good observation in a [Store]. It implements [llmlb.Signal].
//
// A failed scrape records its error in the endpoint's [Status] and leaves the
// last good observation in place: it is served until it is older than the
// consumer's maximum age (or Config.MaxAge), and then the endpoint reports no
// observation, so the balancer falls back to its own counts.
//
// An observation's At is when its scrape request was sent: the engine's
// state in the response is no older than that, so the age the balancer
// computes is an upper bound and an observation is never trusted past its
// maximum age. Dispatches made while the scrape was in flight may be missing
// from the response; the balancer counts only its dispatches made after it
// first sees the observation, so none is counted twice.
//
// Creating a Scraper starts nothing: call Run to scrape periodically, or
// Scrape to scrape one endpoint now. All methods are safe for concurrent use.
type Scraper struct {
	cfg      Config
	client   *http.Client
	owned    bool // client is the scraper's own
	store    *Store
	timeout  time.Duration
	maxBytes int64
	maxTgts  int
	jitter   float64
	sem      chan struct{}

	mu      sync.Mutex // protects targets, added, rng, running
	targets map[string]*target
	added   uint64 // counts the SetTargets calls that added targets
	rng     *rand.Rand
	running bool
	kick    chan struct{} // wakes Run when targets are added; buffered 1
}

// testHookSchedule, if set, runs each time Run looks for targets to
// schedule.
var testHookSchedule func()

type target struct {
	key, url string
	inflight atomic.Bool
	removed  atomic.Bool

	mu sync.Mutex // protects st
	st Status
}

// NewScraper returns a Scraper configured by cfg, with no targets.
func NewScraper(cfg Config) (*Scraper, error) {
	switch {
	case cfg.Interval < 0 || (cfg.Interval > 0 && cfg.Interval < time.Millisecond):
		return nil, fmt.Errorf("%w: Interval %v is negative or below 1ms", ErrInvalidConfig, cfg.Interval)
	case cfg.Timeout < 0:
		return nil, fmt.Errorf("%w: Timeout %v is negative", ErrInvalidConfig, cfg.Timeout)
	case !(cfg.Jitter < 1): // also rejects NaN
		return nil, fmt.Errorf("%w: Jitter %v is not below 1", ErrInvalidConfig, cfg.Jitter)
	case cfg.MaxBodyBytes < 0:
		return nil, fmt.Errorf("%w: MaxBodyBytes %d is negative", ErrInvalidConfig, cfg.MaxBodyBytes)
	case cfg.MaxConcurrent < 0:
		return nil, fmt.Errorf("%w: MaxConcurrent %d is negative", ErrInvalidConfig, cfg.MaxConcurrent)
	case cfg.MaxEndpoints < 0:
		return nil, fmt.Errorf("%w: MaxEndpoints %d is negative", ErrInvalidConfig, cfg.MaxEndpoints)
	case cfg.Engine < 0 || cfg.Engine >= numEngines:
		return nil, fmt.Errorf("%w: unknown Engine %d", ErrInvalidConfig, int(cfg.Engine))
	case cfg.MaxAge < 0:
		return nil, fmt.Errorf("%w: MaxAge %v is negative", ErrInvalidConfig, cfg.MaxAge)
	}
	s := &Scraper{
		cfg:      cfg,
		client:   cfg.Client,
		store:    cfg.Store,
		timeout:  cfg.Timeout,
		maxBytes: cfg.MaxBodyBytes,
		maxTgts:  cfg.MaxEndpoints,
		jitter:   cfg.Jitter,
		targets:  make(map[string]*target),
		kick:     make(chan struct{}, 1),
	}
	if s.cfg.Interval == 0 {
		s.cfg.Interval = DefaultInterval
	}
	if s.timeout == 0 {
		s.timeout = min(s.cfg.Interval, DefaultMaxTimeout)
	}
	if s.maxBytes == 0 {
		s.maxBytes = DefaultMaxBodyBytes
	}
	if s.maxTgts == 0 {
		s.maxTgts = DefaultMaxKeys
	}
	switch {
	case s.jitter == 0:
		s.jitter = DefaultJitter
	case s.jitter < 0:
		s.jitter = 0
	}
	conc := cfg.MaxConcurrent
	if conc == 0 {
		conc = DefaultMaxConcurrent
	}
	s.sem = make(chan struct{}, conc)
	if s.store == nil {
		s.store = &Store{cfg: StoreConfig{Clock: cfg.Clock}}
	}
	src := cfg.Rand
	if src == nil {
		src = rand.NewPCG(rand.Uint64(), rand.Uint64())
	}
	s.rng = rand.New(src)
	if s.client == nil {
		s.client, s.owned = defaultClient(conc), true
	}
	return s, nil
}

// maxHeaderBytes bounds the response headers the default client reads: a
// metrics endpoint sends a few hundred bytes of them, and net/http's own
// default (10 MiB) is more than the body a scrape may have. It is the bound
// net/http's server puts on request headers (http.DefaultMaxHeaderBytes).
const maxHeaderBytes = 1 << 20

// defaultClient returns the client used when Config.Client is nil: direct
// connections (no proxy from the environment: metrics endpoints are internal),
// kept alive across scrapes, at most DefaultMaxRedirects redirects, response
// headers of at most 1 MiB.
func defaultClient(conc int) *http.Client {
	tr := &http.Transport{
		DialContext:           (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:          max(100, conc),
		MaxIdleConnsPerHost:   2,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   5 * time.Second,
		ExpectContinueTimeout: time.Second,
		// net/http's default allows 10 MiB of response headers, more
		// than the body a scrape is allowed by default.
		MaxResponseHeaderBytes: maxHeaderBytes,
	}
	return &http.Client{
		Transport: tr,
		CheckRedirect: func(req *http.Request, via []*http.Request) error {
			if len(via) > DefaultMaxRedirects {
				return fmt.Errorf("signals: stopped after %d redirects", DefaultMaxRedirects)
			}
			return nil
		},
	}
}

func (s *Scraper) now() time.Time {
	if s.cfg.Clock == nil {
		return time.Now()
	}
	return s.cfg.Clock.Now()
}

// Store returns the store the scraper records into.
func (s *Scraper) Store() *Store { return s.store }

// Load returns the newest observation of the endpoint key, scraped or
// pushed into the scraper's Store, implementing [llmlb.Signal]. It reports
// false if there is none or it is older than Config.MaxAge (or that far
// ahead of the clock).
func (s *Scraper) Load(key string) (llmlb.Load, bool) {
	o, ok := s.Observation(key)
	return o.Load, ok
}

// Loader is for the balancers of this module, which alone can name its
// first argument: it returns a function that returns key's observation as
// Load would, or nil, without looking key up again once the store holds
// it, and without copying it. The observation must not be modified.
func (s *Scraper) Loader(t stamped.Token, key string) func() *llmlb.Load {
	load := s.store.Loader(t, key)
	if s.cfg.MaxAge <= 0 {
		return load
	}
	return func() *llmlb.Load {
		if l := load(); l != nil && fresh(s.now(), l.At, s.cfg.MaxAge) {
			return l
		}
		return nil
	}
}

// Observation is like Load but returns the full observation.
func (s *Scraper) Observation(key string) (Observation, bool) {
	o, ok := s.store.Observation(key)
	if ok && s.cfg.MaxAge > 0 && !fresh(s.now(), o.At, s.cfg.MaxAge) {
		return Observation{}, false
	}
	return o, ok
}

func checkURL(key, raw string) error {
	if key == "" {
		return fmt.Errorf("%w: empty endpoint key", ErrInvalidConfig)
	}
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("%w: endpoint %q: %v", ErrInvalidConfig, key, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("%w: endpoint %q: metrics URL %q is not an absolute http(s) URL", ErrInvalidConfig, key, raw)
	}
	return nil
}

// SetTargets replaces the targets: targets maps each endpoint key to its
// metrics URL (such as "http://10.0.0.7:8000/metrics"). Endpoints no longer
// listed are forgotten, with their observations; an endpoint listed with a
// new URL keeps its observation until a scrape of the new URL replaces it.
// A scrape in flight of a forgotten endpoint, or of a replaced URL,
// completes without recording. New targets are scraped by a running Run
// within one Interval. On error nothing changes.
func (s *Scraper) SetTargets(targets map[string]string) error {
	if len(targets) > s.maxTgts {
		return fmt.Errorf("%w: %d targets, above the maximum %d", ErrTooManyKeys, len(targets), s.maxTgts)
	}
	for k, u := range targets {
		if err := checkURL(k, u); err != nil {
			return err
		}
	}
	s.mu.Lock()
	for k, t := range s.targets {
		if u, ok := targets[k]; !ok || u != t.url {
			t.removed.Store(true)
			delete(s.targets, k)
			if !ok {
				s.store.Delete(k)
			}
		}
	}
	added := false
	for k, u := range targets {
		if s.targets[k] == nil {
			s.targets[k] = newTarget(k, u)
			added = true
		}
	}
	if added {
		s.added++
	}
	s.mu.Unlock()
	if added {
		s.wake()
	}
	return nil
}

func newTarget(key, u string) *target {
	t := &target{key: key, url: u}
	t.st.Key, t.st.URL = key, u
	return t
}

func (s *Scraper) wake() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// Status returns the scrape status of the endpoint key.
func (s *Scraper) Status(key string) (Status, bool) {
	s.mu.Lock()
	t := s.targets[key]
	s.mu.Unlock()
	if t == nil {
		return Status{}, false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.st, true
}

// Statuses returns the scrape status of every target, sorted by key.
func (s *Scraper) Statuses() []Status {
	s.mu.Lock()
	ts := make([]*target, 0, len(s.targets))
	for _, t := range s.targets {
		ts = append(ts, t)
	}
	s.mu.Unlock()
	out := make([]Status, len(ts))
	for i, t := range ts {
		t.mu.Lock()
		out[i] = t.st
		t.mu.Unlock()
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out
}

// Scrape scrapes the endpoint key now, records a good observation, updates
// the endpoint's status, and returns the observation or a [*ScrapeError].
// It is for single-shot use and tests; Run calls it on schedule.
func (s *Scraper) Scrape(ctx context.Context, key string) (Observation, error) {
	s.mu.Lock()
	t := s.targets[key]
	s.mu.Unlock()
	if t == nil {
		return Observation{}, fmt.Errorf("%w: %q", ErrUnknownEndpoint, key)
	}
	return s.scrape(ctx, t)
}

func (s *Scraper) scrape(ctx context.Context, t *target) (Observation, error) {
	sent := s.now()
	start := time.Now()
	o, err := s.fetch(ctx, t.url)
	if err == nil {
		o.At = sent
		s.mu.Lock() // a target is removed, and its observation deleted, under s.mu
		if !t.removed.Load() {
			err = s.store.RecordObservation(t.key, o)
		}
		s.mu.Unlock()
	}
	if err != nil && ctx.Err() != nil && !errors.Is(ctx.Err(), context.DeadlineExceeded) {
		// The caller gave up (Run is stopping): not the endpoint's failure.
		return Observation{}, &ScrapeError{Key: t.key, URL: t.url, Err: err}
	}
	d := time.Since(start)
	t.mu.Lock()
	prev := t.st
	t.st.Scrapes++
	t.st.LastDuration = d
	if err != nil {
		err = &ScrapeError{Key: t.key, URL: t.url, Err: err}
		t.st.Failures++
		t.st.ConsecutiveFailures++
		t.st.LastError, t.st.LastErrorAt = err, sent
	} else {
		t.st.ConsecutiveFailures = 0
		t.st.LastSuccess, t.st.Engine = sent, o.Engine
	}
	cur := t.st
	t.mu.Unlock()
	// A target removed during its scrape is no longer the caller's to log.
	if s.cfg.OnResult != nil && !t.removed.Load() {
		s.cfg.OnResult(prev, cur)
	}
	if err != nil {
		return Observation{}, err
	}
	return o, nil
}

// fetch GETs and parses one exposition.
func (s *Scraper) fetch(ctx context.Context, u string) (Observation, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return Observation{}, err
	}
	req.Header.Set("Accept", acceptHeader)
	resp, err := s.client.Do(req)
	if err != nil {
		return Observation{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		_, _ = io.CopyN(io.Discard, resp.Body, 4<<10) // let a short error body keep the connection
		return Observation{}, fmt.Errorf("%w: %s", ErrHTTPStatus, clip(resp.Status))
	}
	var body io.Reader = resp.Body
	if !resp.Uncompressed && strings.EqualFold(resp.Header.Get("Content-Encoding"), "gzip") {
		zr, err := gzip.NewReader(resp.Body)
		if err != nil {
			return Observation{}, fmt.Errorf("%w: gzip: %v", ErrParse, err)
		}
		defer zr.Close()
		body = zr
	}
	bp := bufPool.Get().(*[]byte)
	defer func() {
		if cap(*bp) <= maxPooled {
			*bp = (*bp)[:0]
			bufPool.Put(bp)
		}
	}()
	hint := resp.ContentLength
	if body != resp.Body || resp.Uncompressed {
		hint = -1 // the length is of the compressed body
	}
	if err := readCapped(body, bp, s.maxBytes, hint); err != nil {
		return Observation{}, err
	}
	return parseBody(*bp, resp.Header.Get("Content-Type"), s.cfg.Engine)
}

// clip bounds a string from the metrics endpoint, such as its status line,
// before it goes into an error that is kept and logged.
func clip(s string) string {
	if len(s) > maxClip {
		return strings.ToValidUTF8(s[:maxClip], "") + "..."
	}
	return s
}

const maxClip = 128

// bufPool recycles body buffers of up to maxPooled bytes across scrapes.
var bufPool = sync.Pool{New: func() any { return new([]byte) }}

const (
	minBuf    = 32 << 10
	maxPooled = 1 << 20
)

// readCapped reads r to its end into *bp, failing once more than limit bytes
// arrive; it never reads more than limit+1 bytes nor allocates more than
// about twice that. hint is the expected size (Content-Length), or -1.
func readCapped(r io.Reader, bp *[]byte, limit, hint int64) error {
	size := int64(minBuf)
	if hint > 0 {
		// +1 to see the end of the body without growing; min first, as a
		// hostile Content-Length may be the largest int64.
		size = min(hint, limit) + 1
	}
	size = min(size, limit+1)
	b := (*bp)[:0]
	if int64(cap(b)) < size {
		b = make([]byte, 0, size)
	}
	for {
		if len(b) == cap(b) {
			if int64(len(b)) > limit {
				*bp = b
				return fmt.Errorf("%w: more than %d bytes", ErrBodyTooLarge, limit)
			}
			c := 2 * int64(cap(b))
			if c >= limit {
				c = limit + 1
			}
			nb := make([]byte, len(b), c)
			copy(nb, b)
			b = nb
		}
		n, err := r.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if err == io.EOF {
			*bp = b
			if int64(len(b)) > limit {
				return fmt.Errorf("%w: more than %d bytes", ErrBodyTooLarge, limit)
			}
			return nil
		}
		if err != nil {
			*bp = b
			return fmt.Errorf("reading body: %w", err)
		}
	}
}

// Close releases the idle connections of the scraper's own HTTP client. It
// does not stop Run (cancel its context) and the scraper remains usable.
func (s *Scraper) Close() {
	if s.owned {
		s.client.CloseIdleConnections()
	}
}

// Run scrapes every target on its own schedule until ctx is done: each
// endpoint first at a random phase within one Interval, then every Interval
// lengthened or shortened by up to Jitter. A scrape still in flight when the
// next is due makes the next one be skipped. Run keeps at most
// Config.MaxConcurrent scrapes in flight. When ctx is done, Run waits for the
// scrapes in flight to stop, closes the idle connections of the scraper's
// own client, and returns ctx.Err(). Run may be called again after it
// returns, but not twice at once: a call while another is running returns
// [ErrRunning] at once.
func (s *Scraper) Run(ctx context.Context) error {
	s.mu.Lock()
	if s.running {
		s.mu.Unlock()
		return ErrRunning
	}
	s.running = true
	s.mu.Unlock()
	var wg sync.WaitGroup
	defer func() {
		wg.Wait()
		s.Close()
		s.mu.Lock()
		s.running = false
		s.mu.Unlock()
	}()

	var q schedule
	scheduled := make(map[*target]bool)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	first, seen := true, uint64(0)
	for {
		// Schedule targets added since the last pass. Only a SetTargets
		// that added some calls for a look at them all: each pass of a
		// scraper with many targets would cost time in their number, and
		// there is a pass for each scrape.
		now := time.Now()
		s.mu.Lock()
		if first || s.added != seen {
			first, seen = false, s.added
			if testHookSchedule != nil {
				testHookSchedule()
			}
			for _, t := range s.targets {
				if !scheduled[t] {
					scheduled[t] = true
					// A random phase within one interval staggers the endpoints.
					phase := time.Duration(s.rng.Int64N(int64(s.cfg.Interval)))
					heap.Push(&q, item{at: now.Add(phase), t: t})
				}
			}
		}
		s.mu.Unlock()
		// Start the scrapes that are due.
		for q.Len() > 0 && !q[0].at.After(now) {
			it := heap.Pop(&q).(item)
			if it.t.removed.Load() {
				delete(scheduled, it.t)
				continue
			}
			heap.Push(&q, item{at: now.Add(s.wait()), t: it.t})
			if !it.t.inflight.CompareAndSwap(false, true) {
				continue
			}
			select {
			case s.sem <- struct{}{}:
			case <-ctx.Done():
				it.t.inflight.Store(false)
				return ctx.Err()
			}
			wg.Add(1)
			go func(t *target) {
				defer wg.Done()
				defer func() { <-s.sem; t.inflight.Store(false) }()
				_, _ = s.scrape(ctx, t)
			}(it.t)
		}
		d := time.Hour
		if q.Len() > 0 {
			d = time.Until(q[0].at)
		}
		timer.Reset(d)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-s.kick:
		case <-timer.C:
		}
	}
}

// wait returns the Interval with jitter applied; the caller holds no lock.
func (s *Scraper) wait() time.Duration {
	if s.jitter == 0 {
		return s.cfg.Interval
	}
	s.mu.Lock()
	u := s.rng.Float64()
	s.mu.Unlock()
	return time.Duration(float64(s.cfg.Interval) * (1 + s.jitter*(2*u-1)))
}

// schedule is a min-heap of scrapes by due time.
type schedule []item

type item struct {
	at time.Time
	t  *target
}

func (q schedule) Len() int           { return len(q) }
func (q schedule) Less(i, j int) bool { return q[i].at.Before(q[j].at) }
func (q schedule) Swap(i, j int)      { q[i], q[j] = q[j], q[i] }
func (q *schedule) Push(x any)        { *q = append(*q, x.(item)) }
func (q *schedule) Pop() any {
	old := *q
	it := old[len(old)-1]
	*q = old[:len(old)-1]
	return it
}
