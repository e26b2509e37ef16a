// Package gateway is a ready OpenAI-compatible routing gateway: an
// [http.Handler] that sends each request to one of a list of replicas with
// an llmlb policy, built from the library's parts in one call.
//
//	g, err := gateway.New([]string{"http://10.0.0.7:8000", "http://10.0.0.8:8000"}, gateway.Config{})
//	go g.Run(ctx)
//	http.ListenAndServe(":8080", g)
//
// A [Gateway] routes with llmlb's Default policy unless told otherwise,
// scrapes each replica's /metrics ([signals.Scraper]), through the same
// transport as the requests, as the balancer's signal (updated by the ORCA
// load reports the replicas send with their responses, if they do),
// streams responses through an [httplb.Transport] that retries
// failures before the first token on another replica, ejects replicas that
// keep failing ([retry.Ejector]), keeps a replica whose scrape says its
// engine is asleep (vLLM's sleep mode, [signals.Observation].Asleep) out of
// picks while another is awake and, if configured, caps admission. Every
// upstream failure, refusal, ejection and scrape failure is logged with
// log/slog (clients get a generic error with a request id; the detail goes
// to the log). [Gateway.Debug] serves a JSON view of the endpoints, their
// loads, signal ages, scrape status and prefix index sizes.
//
// For anything this does not cover, build the same from the parts:
// [httplb.NewTransport], [httplb.NewProxy], [signals.NewScraper] and
// [retry.NewEjector]. A Gateway is safe for concurrent use; New starts no
// goroutine, [Gateway.Run] runs the background work until its context ends.
//
// This package's plain data types (Config, DebugState, DebugQueue,
// DebugShare, DebugEndpoint, DebugSignal, DebugScrape) hold no lock: any
// number of goroutines may read a value of one at once, but none may write
// it meanwhile.
package gateway

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/fair"
	"github.com/llmlb/llmlb/httplb"
	"github.com/llmlb/llmlb/prefix"
	"github.com/llmlb/llmlb/retry"
	"github.com/llmlb/llmlb/share"
	"github.com/llmlb/llmlb/signals"
	"github.com/llmlb/llmlb/spill"
)

// ErrInvalidConfig wraps every configuration error of [New] and
// [Gateway.Update].
var ErrInvalidConfig = errors.New("gateway: invalid config")

// Config configures a [Gateway]. The zero value is valid: every zero field
// is a documented default.
type Config struct {
	// Policy routes the requests. nil means llmlb.Default over Index with
	// its defaults.
	Policy llmlb.Policy
	// Index is the prefix index Policy records into, reported by Debug.
	// With a nil Policy, nil means a new index with package prefix's
	// defaults; with a Policy, nil leaves index sizes out of Debug.
	Index *prefix.Index
	// Events is an index fed by the engines' KV events (package kvevents),
	// reported by Debug. With a nil Policy, Default reads it
	// (llmlb.DefaultConfig.Events): prompts must then be hashed as the
	// engines hash them, in token mode ([httplb.ParserConfig.Tokenize]).
	// nil means the engines' events are not read.
	Events *prefix.Index
	// ScrapeInterval is the time between two scrapes of a replica's
	// /metrics, sent through Base; an observation is trusted, and its
	// values kept while ORCA reports update some of them, for three
	// intervals. 0 means [signals.DefaultInterval]; a negative value turns
	// scraping off, and the balancer then counts only its own dispatches.
	ScrapeInterval time.Duration
	// Retry configures the retries and hedges of each request before its
	// first token, as [httplb.Config].Retry does, and its zero fields mean
	// the same defaults (three attempts, no hedging), except for what the
	// gateway fills in:
	//
	//   - Reporter: nil means the gateway's [retry.Ejector], which ejects
	//     the replicas that keep failing, cools down those that ask for a
	//     wait or whose quota is spent, and answers [Gateway.Headroom] and
	//     the readiness of [Gateway.Tier]; it reads Clock, as the
	//     retries do. A Reporter of yours replaces it: the ejector is
	//     then told nothing, so no replica is ejected or cooled down and
	//     Headroom reports nothing.
	//   - Observer: the gateway logs every retry, hedge and refusal by the
	//     budget, and every ejection and admission refusal, and probes (for
	//     a stored response, see httplb.Transport) at debug level, and then
	//     tells Observer, if set, of each (package telemetry's
	//     Metrics.RetryObserver provides one).
	//   - MaxPushback: with SpillTo, 0 means -1: a replica's Retry-After
	//     does not delay the retry on another replica.
	//   - Classify: with SpillTo and the gateway's ejector as Reporter, an
	//     answer asking for a wait (HTTP 429, or 503 with a wait asked) is
	//     retried only while another replica is in picks, whatever
	//     Classify says; otherwise the request spills at once.
	Retry retry.LoopConfig
	// FirstEventTimeout, if positive, fails an attempt that has sent no
	// event after it, so it is retried elsewhere; see
	// [httplb.Config.FirstEventTimeout]. 0 turns it off.
	FirstEventTimeout time.Duration
	// BodyTimeout bounds the time a client takes to send its request body,
	// from the start of ServeHTTP: a client that sends slower (holding a
	// connection and the memory of its body) gets its request failed. It
	// is a read deadline on the request's connection, set and cleared
	// through [http.ResponseController], so it does not cut responses
	// that stream longer, as [http.Server.ReadTimeout] would. 0 means
	// DefaultBodyTimeout; a negative value sets no deadline.
	BodyTimeout time.Duration
	// Admission caps requests in flight, globally and per session; the zero
	// value caps nothing. Refused requests get 429 with Retry-After. Each
	// refusal is logged and told to Retry.Observer, then to
	// Admission.Observer, if set and not the same.
	Admission retry.AdmissionConfig
	// Queue, if set, admits requests through a token-fair queue (package
	// fair): by priority class, then by the service each tenant (or, with
	// no tenant, client address; see [httplb.Config].Queue) has received.
	// TrustClassHeader names the header that carries the class; see
	// [httplb.Config].TrustClassHeader.
	Queue            *fair.Queue
	TrustClassHeader string
	// Parser configures how request bodies are read: the tenant (from your
	// authentication), the session header, the token counter.
	Parser httplb.ParserConfig
	// Logger receives the operator's log. nil means [slog.Default].
	Logger *slog.Logger
	// Observer, if set, is told of every pick, first token and completion
	// (package telemetry provides one). Retry.Observer is told of the
	// retries, hedges, ejections and refusals.
	Observer *llmlb.Observer
	// Base sends the upstream requests and the scrapes of the replicas'
	// /metrics, so that both take the same proxy, TLS configuration (a
	// custom CA, client certificates) and connections. A scrape follows at
	// most [signals.DefaultMaxRedirects] redirects, within its replica's
	// scheme and host, and is bounded in time and body size by the scraper
	// ([signals.Config]), whatever Base. nil
	// means a clone of [http.DefaultTransport] (its proxy from the
	// environment, dial and TLS handshake timeouts, and 1 MiB of response
	// headers at most) that keeps up to 256 idle connections per replica
	// for at most 4 seconds: the engines' servers close a connection idle
	// for 5. A Base of your own should keep idle connections for less time
	// than the replicas do.
	Base http.RoundTripper
	// Share, if not nil, makes this gateway one replica of a group that
	// exchanges its requests in flight and routed prefixes with the other
	// replicas over NATS (package share): set its Conn, and its Subject and
	// ID if the defaults do not fit. The gateway sets its Signal (the
	// scraper), MaxSignalAge, Index (the policy's decision index, when the
	// gateway knows it) and, if nil, its Logger; [Gateway.Run] runs it. All
	// replicas must be given the same backends. nil shares nothing.
	Share *share.Config
	// Outputs, if not nil, has the balancer learn the output lengths of
	// each kind of request (tenant and Parser's Feature: the model and
	// reasoning effort) from the tokens the responses stream, and charge
	// them as decode work instead of a fixed allowance
	// ([llmlb.WithOutputPrediction]). nil charges the allowance.
	Outputs *llmlb.OutputConfig
	// SpillTo, if not empty, lists the tiers a request spills to, in
	// order, when this gateway's replicas cannot take it: a 429 or a full
	// admission or queue, a 5xx, a context-length 400 (see package spill
	// and [spill.DefaultSpill]). Build a tier from another Gateway, such as
	// one in front of a managed provider's deployments, with
	// [Gateway.Tier]. A spilled response carries [spill.DefaultHeader]
	// naming Name, the tier it left. With SpillTo, a replica's Retry-After
	// does not delay the retry on another replica (unless Retry.MaxPushback
	// is set), an answer asking for a wait is not retried when no other
	// replica is in picks (neither the replica that asked nor one cooling
	// down is asked again), and when every replica's retries are spent the
	// request spills at once; while every replica is ejected, cooling down or
	// asleep, requests go to the next tier directly. The request body is
	// kept for replay to the next tier, up to Parser's MaxBodyBytes, the
	// cap it has without SpillTo; the tiers' cooldowns run on Retry.Clock,
	// as the ejector's do. A request the gateway refuses itself (its
	// tenant not established by Parser) does not spill, nor does one a
	// replica refuses as invalid (a 400 other than a context too long);
	// and a tier's answer whose status is about the tier (401, 403, 429,
	// 5xx) reaches the client with its status but a generic body, as
	// package spill describes. nil spills nothing.
	SpillTo []spill.Tier
	// Name names this gateway's replicas as a tier in spilled responses'
	// header and in SpillObserver's events. "" means "primary".
	Name string
	// SpillObserver, if set, is told of every spill, for example by
	// telemetry's SpillObserver; the gateway also logs each one at debug
	// level, and the answer it spilled past (the replica, its status or
	// error and its body) at level Warn for a failure and Info otherwise,
	// once every ten seconds for a replica, with the count of those left
	// out (see package spill).
	SpillObserver func(spill.Event)
	// AllowPaths lists request paths forwarded to the replicas besides
	// the inference APIs' a Gateway forwards by default; each is a clean
	// absolute path, or one ending in "/" for every path under it, and
	// "/" forwards every path. By default a Gateway forwards the
	// OpenAI-compatible routes (/v1/completions, /v1/chat/completions,
	// /v1/responses and /v1/responses/..., /v1/embeddings, /v1/models and
	// /v1/models/..., /v1/messages, /v1/messages/count_tokens,
	// /v1/audio/transcriptions, /v1/audio/translations, /v1/score,
	// /v1/rerank, /v2/rerank, /v1/classify), vLLM's, SGLang's, TGI's and
	// llama.cpp's own inference routes (/score, /rerank, /pooling,
	// /classify, /tokenize, /detokenize, /generate, /generate_stream,
	// /completion, /completions, /chat/completions, /embedding,
	// /embeddings, /infill) and the probes /health, /ping and /version,
	// and answers any other path 404 without sending it on: the engines'
	// administration endpoints (vLLM's /sleep, /wake_up, /collective_rpc
	// and /v1/load_lora_adapter; SGLang's /update_weights_from_disk and
	// /flush_cache; llama.cpp's /slots) would otherwise let any client
	// put a replica to sleep or change what it serves. A path is matched
	// with its dot segments resolved, as it is forwarded.
	AllowPaths []string
}

// Gateway routes OpenAI-compatible requests across replicas. Create one
// with [New]. It is safe for concurrent use: ServeHTTP serves requests
// while Run sweeps and Update replaces the backends.
type Gateway struct {
	log       *slog.Logger
	balancer  *llmlb.Balancer
	index     *prefix.Index
	events    *prefix.Index    // nil without KV events
	scraper   *signals.Scraper // nil without scraping
	group     *share.Group     // nil without sharing
	ejector   *retry.Ejector
	health    *health          // marks the balancer for the ejector and the sleeping engines
	admission *retry.Admission // nil without caps
	queue     *fair.Queue      // nil without a fair queue
	transport *httplb.Transport
	spill     *spill.Transport // nil without SpillTo
	proxy     *httputil.ReverseProxy
	paths     pathSet // the paths forwarded
	// bodyTimeout bounds the reading of a request body; 0 for none.
	bodyTimeout time.Duration
	// scrapeEvery is the time between two scrapes of a replica; 0
	// without scraping.
	scrapeEvery time.Duration
	// running is set while Run runs.
	running atomic.Bool

	mu       sync.Mutex // protects backends
	backends []string   // endpoint keys, in the order given
}

// idleConnTimeout is how long the default Base keeps a connection to a
// replica with no request on it. The engines' servers close one idle for 5
// seconds (uvicorn's default timeout_keep_alive, which vLLM, SGLang and
// TensorRT-LLM's servers keep; cpp-httplib's keep-alive in llama.cpp's), and
// a request sent on a connection just as its server closes it fails: a POST
// is not retried by net/http, and the attempt counts as the replica's
// failure. Closing it first, the gateway never sends on one.
const idleConnTimeout = 4 * time.Second

// defaultBase returns the Transport of a Config without Base.
func defaultBase() *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConns = 0 // no bound over all replicas
	t.MaxIdleConnsPerHost = 256
	t.IdleConnTimeout = idleConnTimeout
	// A replica's response headers are bounded per attempt well below
	// net/http's default of 10 MB.
	t.MaxResponseHeaderBytes = 1 << 20
	return t
}

// scrapeClient returns the client that scrapes the replicas' /metrics: it
// sends the scrapes through base, as the upstream requests are sent, so that
// both take the same proxy, TLS configuration and connections, and follows at
// most [signals.DefaultMaxRedirects] redirects, as the scraper's own client
// does, on the replica's own scheme and host only: a Base that adds
// credentials to each request sends them to the replicas alone. The scraper
// bounds each scrape's time and body itself.
func scrapeClient(base http.RoundTripper) *http.Client {
	return &http.Client{
		Transport: base,
		CheckRedirect: func(req *http.Request, via []*http.Request) error {
			if len(via) > signals.DefaultMaxRedirects {
				return fmt.Errorf("gateway: scrape stopped after %d redirects", signals.DefaultMaxRedirects)
			}
			if u := via[0].URL; req.URL.Scheme != u.Scheme || req.URL.Host != u.Host {
				return errors.New("gateway: scrape redirected to another host")
			}
			return nil
		},
	}
}

// New returns a gateway in front of the replicas at the base URLs backends
// (for example "http://10.0.0.7:8000"), or an error wrapping
// [ErrInvalidConfig]. A base URL is the server's, not its OpenAI API's: one
// whose path ends in /v1 is refused, since the client's /v1/... path is
// forwarded as it was sent (see [httplb.Endpoint]). With no backends, every
// request is answered 503 until [Gateway.Update] gives some.
func New(backends []string, cfg Config) (*Gateway, error) {
	g := &Gateway{log: cfg.Logger, index: cfg.Index, events: cfg.Events, queue: cfg.Queue, bodyTimeout: cfg.BodyTimeout}
	paths, err := newPathSet(cfg.AllowPaths)
	if err != nil {
		return nil, err
	}
	g.paths = paths
	if g.log == nil {
		g.log = slog.Default()
	}
	switch {
	case g.bodyTimeout == 0:
		g.bodyTimeout = DefaultBodyTimeout
	case g.bodyTimeout < 0:
		g.bodyTimeout = 0
	}
	policy := cfg.Policy
	if policy == nil {
		if g.index == nil {
			ix, err := prefix.NewIndex(prefix.IndexConfig{})
			if err != nil {
				return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
			}
			g.index = ix
		}
		p, err := llmlb.Default(llmlb.DefaultConfig{Index: g.index, Events: g.events})
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
		}
		policy = p
	}
	base := cfg.Base
	if base == nil {
		base = defaultBase()
	}
	var (
		opts   []llmlb.Option
		store  *signals.Store
		signal llmlb.Signal
		maxAge = llmlb.DefaultMaxSignalAge
	)
	if cfg.ScrapeInterval >= 0 {
		interval := cfg.ScrapeInterval
		if interval == 0 {
			interval = signals.DefaultInterval
		}
		maxAge = 3 * interval
		if maxAge/3 != interval {
			maxAge = math.MaxInt64 // an interval of a century or more
		}
		// The store keeps a scrape's values no longer than the balancer
		// trusts them: past maxAge, the ORCA reports that keep arriving
		// while the scrapes fail do not keep the fields they lack (the
		// running requests, the adapters), and the debug view shows no
		// observation older than the balancer would use.
		st, err := signals.NewStore(signals.StoreConfig{MaxAge: maxAge})
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
		}
		s, err := signals.NewScraper(signals.Config{Interval: interval, OnResult: g.scraped, Client: scrapeClient(base), Store: st})
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
		}
		g.scraper, store, signal = s, st, s
		g.scrapeEvery = interval
	}
	observer := cfg.Observer
	if cfg.Share != nil {
		if cfg.Share.Conn == nil {
			return nil, fmt.Errorf("%w: Share has no Conn", ErrInvalidConfig)
		}
		sc := *cfg.Share
		sc.Signal, sc.MaxSignalAge, sc.Index = signal, maxAge, g.index
		if sc.Logger == nil {
			sc.Logger = g.log
		}
		group, err := share.New(sc)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
		}
		g.group, signal = group, group
		observer = group.Observer(observer)
	}
	if signal != nil {
		opts = append(opts, llmlb.WithSignal(signal, maxAge))
	}
	if observer != nil {
		opts = append(opts, llmlb.WithObserver(observer))
	}
	if cfg.Outputs != nil {
		opts = append(opts, llmlb.WithOutputPrediction(*cfg.Outputs))
	}
	b, err := llmlb.New(policy, opts...)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	g.balancer = b
	g.health = newHealth(b)
	obs := g.retryObserver(cfg.Retry.Observer)
	if g.ejector, err = retry.NewEjector(g.health, retry.EjectorConfig{Observer: obs, Clock: cfg.Retry.Clock}); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	if cfg.Admission != (retry.AdmissionConfig{}) {
		ac := cfg.Admission
		ac.Observer = obs
		if u := cfg.Admission.Observer; u != nil && u != cfg.Retry.Observer && u.Reject != nil {
			// The admission's own Observer is told too, after the log
			// and Retry.Observer (once, if it is the same).
			ac.Observer = &retry.Observer{Reject: func(err *retry.OverloadError) {
				obs.Reject(err)
				u.Reject(err)
			}}
		}
		if g.admission, err = retry.NewAdmission(ac); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
		}
	}
	parser, err := httplb.NewParser(cfg.Parser)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	rc := cfg.Retry
	if rc.Reporter == nil {
		rc.Reporter = g.ejector
	}
	rc.Observer = obs
	if len(cfg.SpillTo) > 0 && rc.MaxPushback == 0 {
		// A replica's Retry-After does not hold back the retries on the
		// others: spilling is the better answer than waiting.
		rc.MaxPushback = -1
	}
	if len(cfg.SpillTo) > 0 && rc.Reporter == g.ejector {
		rc.Classify = g.spillClassify(rc.Classify, rc.Clock)
	}
	g.transport, err = httplb.NewTransport(httplb.Config{
		Balancer:          b,
		Base:              base,
		Parser:            parser,
		Retry:             rc,
		FirstEventTimeout: cfg.FirstEventTimeout,
		Admission:         g.admission,
		Queue:             cfg.Queue,
		TrustClassHeader:  cfg.TrustClassHeader,
		Store:             store, // ORCA headers, when the replicas send them
	})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	g.proxy = httplb.NewProxy(g.transport)
	g.proxy.ErrorHandler = httplb.NewErrorHandler(g.log)
	g.proxy.ModifyResponse = httplb.NewUpstreamErrorHandler(g.log)
	// What the proxy itself reports, such as a stream cut after its first
	// token, goes to the same log.
	g.proxy.ErrorLog = slog.NewLogLogger(g.log.Handler(), slog.LevelWarn)
	if len(cfg.SpillTo) > 0 {
		name := cfg.Name
		if name == "" {
			name = "primary"
		}
		user := cfg.SpillObserver
		g.spill, err = spill.New(spill.Config{
			Tiers: append([]spill.Tier{g.Tier(name)}, cfg.SpillTo...),
			// The body kept for replay is bounded as the replicas' parser
			// bounds it: the first tier refuses a longer one anyway, and a
			// spill cap of its own would refuse bodies the parser takes.
			MaxBodyBytes: parser.MaxBodyBytes(),
			// The tiers' cooldowns run on the clock of the replicas'.
			Clock: cfg.Retry.Clock,
			// The answers that requests spill past, which neither the
			// client nor the proxy's handlers see, are logged by spill,
			// with the replica that gave them: a failure at level Warn,
			// once in each interval for a replica.
			Logger: g.log,
			Observer: func(e spill.Event) {
				g.log.Debug("gateway: request spilled", "from", e.From, "to", e.To, "reason", string(e.Reason))
				if user != nil {
					user(e)
				}
			},
		})
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
		}
		g.proxy.Transport = g.spill
	}
	if err := g.Update(backends); err != nil {
		return nil, err
	}
	return g, nil
}

// Update replaces the replicas with those at the base URLs backends, which
// New describes. Requests in flight to a replica that leaves finish
// normally.
func (g *Gateway) Update(backends []string) error {
	eps, err := httplb.NewEndpoints(backends...)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	for _, ep := range eps {
		// The gateway serves the client's /v1/... paths from its root and
		// scrapes <base>/metrics: a base ending in /v1 would double it.
		if u, err := url.Parse(ep.Key()); err == nil && strings.HasSuffix(u.Path, "/v1") {
			u.Path = strings.TrimSuffix(u.Path, "/v1")
			return fmt.Errorf("%w: backend %q: give the server's base URL, %s, without /v1: the client's /v1/... path is forwarded as it was sent", ErrInvalidConfig, ep.Key(), u)
		}
	}
	keys := make([]string, len(eps))
	targets := make(map[string]string, len(eps))
	for i, ep := range eps {
		// Refused here, before the scraper is given the new targets: a
		// failed Update changes nothing.
		if _, dup := targets[ep.Key()]; dup {
			return fmt.Errorf("%w: backend %q is listed twice", ErrInvalidConfig, ep.Key())
		}
		keys[i] = ep.Key()
		targets[ep.Key()] = ep.Key() + "/metrics"
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.scraper != nil {
		if err := g.scraper.SetTargets(targets); err != nil {
			return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
		}
	}
	if err := g.balancer.Update(eps); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	g.health.retain(targets)
	g.backends = keys
	return nil
}

// spillClassify returns the classifier of the retries of a gateway with
// SpillTo: classify (nil means [retry.DefaultClassify]), except that an
// answer asking for a wait (HTTP 429, or 503 with a wait asked), which
// cools its replica down, is not retried while no other replica is in
// picks. Retried, it would go back to the replica that asked to be left
// alone, or to one held out, when the request can go to the next tier at
// once.
func (g *Gateway) spillClassify(classify func(error) bool, clock llmlb.Clock) func(error) bool {
	if classify == nil {
		classify = retry.DefaultClassify
	}
	now := time.Now
	if clock != nil {
		now = clock.Now
	}
	return func(err error) bool {
		if !classify(err) {
			return false
		}
		var se *retry.StatusError
		if !errors.As(err, &se) || se.GRPC || se.Code != http.StatusTooManyRequests && se.Code != http.StatusServiceUnavailable {
			return true
		}
		// The ejector's rule for a cooldown (retry.Ejector), read before
		// it is told of this answer.
		if p := retry.FromHeader(se.Header, now(), math.MaxInt64); p.Kind != retry.RetryLater || p.Delay <= 0 {
			return true
		}
		// The replica that answered is still in picks, unless it was
		// picked while held out: another is in if two are.
		g.ejector.Out()
		g.mu.Lock()
		n := g.health.countIn(g.backends, 2)
		g.mu.Unlock()
		return n >= 2
	}
}

// errRunning is the error of a Run called while another is running.
var errRunning = errors.New("gateway: Run is already running")

// DefaultBodyTimeout is the default of [Config].BodyTimeout.
const DefaultBodyTimeout = 30 * time.Second

// ServeHTTP routes one request, or answers 404 for a path it does not
// forward (see [Config].AllowPaths).
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !g.paths.allows(r.URL.Path) {
		g.log.LogAttrs(r.Context(), slog.LevelInfo, "gateway: path not forwarded",
			slog.String("method", r.Method), slog.String("path", r.URL.Path))
		notFound(w)
		return
	}
	if g.bodyTimeout > 0 && r.Body != nil && r.Body != http.NoBody {
		rc := http.NewResponseController(w)
		if rc.SetReadDeadline(time.Now().Add(g.bodyTimeout)) == nil {
			r.Body = &deadlineBody{ReadCloser: r.Body, rc: rc}
		}
	}
	g.proxy.ServeHTTP(w, r)
}

// deadlineBody clears its connection's read deadline once the body has
// been read to its end. A body that fails or is closed before its end
// keeps the deadline: the request has failed, and the server would
// otherwise wait without bound to discard the rest of a stalled body.
type deadlineBody struct {
	io.ReadCloser
	rc      *http.ResponseController
	cleared bool
}

func (b *deadlineBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF && !b.cleared {
		b.cleared = true
		_ = b.rc.SetReadDeadline(time.Time{})
	}
	return n, err
}

// Headroom returns the fraction of a backend's rate-limit quota that its
// last answers reported remaining, refilled since ([retry.Ejector.Headroom]);
// false when it reported none. Give it to [llmlb.PeakEWMAConfig].Headroom
// for backends that are managed deployments.
func (g *Gateway) Headroom(backend string) (float64, bool) { return g.ejector.Headroom(backend) }

// Tier returns the gateway's replicas as a tier named name, for another
// gateway's [Config].SpillTo or a [spill.Transport]. Requests sent to the
// tier are routed, retried and accounted for as the gateway's own; run the
// gateway ([Gateway.Run]) for its scraping and ejections to go on. The
// tier is not ready ([spill.Tier].Ready) while every replica is held out
// of picks, ejected, cooling down, asleep or marked unhealthy on
// [Gateway.Balancer]: requests then spill past it rather than wait for a
// sleeping engine to wake or go to replicas taken out of service.
func (g *Gateway) Tier(name string) spill.Tier {
	return spill.Tier{Name: name, Transport: g.transport, Ready: g.ready}
}

// ready reports whether some replica is held out of picks by neither an
// ejection, a cooldown, a sleep ([health]) nor the program's unhealthy
// mark, and if none is, the time until one may be back: the end of the
// first ejection or cooldown, or, while a replica sleeps, the next scrape,
// which finds it awake if it woke, whichever comes first; 0 if only the
// program's marks hold them out, whose end is the program's to tell. A
// gateway without replicas is ready: its requests fail there, and spill.
func (g *Gateway) ready() (bool, time.Duration) {
	// Out ends the ejections that are over, marking their replicas in
	// health, before health is asked.
	out, next := g.ejector.Out()
	// g.mu is held while health reads the balancer, so that the backends
	// are its members.
	g.mu.Lock()
	if len(g.backends) == 0 {
		g.mu.Unlock()
		return true, next
	}
	in, asleep := g.health.anyIn(g.backends)
	g.mu.Unlock()
	if in {
		return true, next
	}
	if asleep && (out == 0 || g.scrapeEvery < next) {
		next = g.scrapeEvery
	}
	return false, next
}

// Balancer returns the gateway's balancer, for its Stats or to mark
// replicas unhealthy. The gateway marks a replica unhealthy while it is
// ejected, cooling down or asleep, unless it is unhealthy already, and
// healthy again when none of these holds it any longer, but only a replica
// it marked itself: one you marked unhealthy before stays so until you mark
// it healthy. A mark you set while the gateway holds the replica out takes
// effect but is not recorded: when the hold ends, the gateway marks the
// replica healthy if it had marked it unhealthy. A tier of the gateway
// ([Gateway.Tier]) is not ready while you have marked unhealthy every
// replica that the gateway does not hold out.
func (g *Gateway) Balancer() *llmlb.Balancer { return g.balancer }

// Run scrapes the replicas, shares state with the other replicas (with
// [Config].Share) and ends ejections that are over until ctx ends, then
// closes idle connections and returns ctx's error. Run may be called again
// after it returns, but not twice at once: a call while another is running
// returns an error at once and changes nothing.
func (g *Gateway) Run(ctx context.Context) error {
	if !g.running.CompareAndSwap(false, true) {
		// A second Run would scrape nothing (the scraper runs once at a
		// time) yet seem to run, and keep seeming to after the first ends.
		return errRunning
	}
	defer g.running.Store(false)
	var wg sync.WaitGroup
	if g.scraper != nil {
		wg.Go(func() { _ = g.scraper.Run(ctx) })
	}
	if g.group != nil {
		wg.Go(func() {
			if err := g.group.Run(ctx); err != nil && ctx.Err() == nil {
				g.log.Error("gateway: sharing stopped", "error", err)
			}
		})
	}
	wg.Go(func() { _ = g.ejector.Run(ctx) })
	wg.Wait()
	g.transport.CloseIdleConnections()
	return ctx.Err()
}

// scraped logs a replica's scrape failures (the first, then each power of
// ten in a row) and its recovery, and keeps the replica out of picks while
// the observation the balancer trusts says its engine is asleep (see
// [health]). A failed scrape leaves the last good observation in place
// until it is older than the balancer trusts: a replica that went to sleep
// and stopped answering its scrapes is then picked again, and the
// ejector judges it by its answers.
func (g *Gateway) scraped(prev, cur signals.Status) {
	switch n := cur.ConsecutiveFailures; {
	case n > 0 && isPowerOfTen(n):
		g.log.Warn("gateway: scrape failed", "endpoint", cur.Key, "url", cur.URL,
			"consecutive_failures", n, "error", cur.LastError)
	case n == 0 && prev.ConsecutiveFailures > 0:
		g.log.Info("gateway: scrape recovered", "endpoint", cur.Key, "failures", prev.ConsecutiveFailures)
	}
	o, ok := g.scraper.Observation(cur.Key)
	asleep := ok && o.Asleep
	if g.health.setAsleep(cur.Key, asleep) {
		if asleep {
			g.log.Info("gateway: engine asleep, not picked while another replica is awake", "endpoint", cur.Key)
		} else {
			g.log.Info("gateway: engine awake", "endpoint", cur.Key)
		}
	}
}

func isPowerOfTen(n int) bool {
	for n%10 == 0 {
		n /= 10
	}
	return n == 1
}

// retryObserver returns an observer that logs retries, ejections and
// refusals and passes every event on to user.
func (g *Gateway) retryObserver(user *retry.Observer) *retry.Observer {
	var u retry.Observer
	if user != nil {
		u = *user
	}
	return &retry.Observer{
		Retry: func(attempt int, cause error) {
			// cause names the endpoint and the request id (see
			// httplb.Config.Retry).
			g.log.Warn("gateway: attempt failed before its first token, retrying", "attempt", attempt, "error", cause)
			if u.Retry != nil {
				u.Retry(attempt, cause)
			}
		},
		Probe: func(attempt int, cause error) {
			// No failure: a request for a stored response the gateway
			// does not know tries the next endpoint (see
			// httplb.Transport).
			g.log.Debug("gateway: stored response not on this endpoint, trying the next", "attempt", attempt, "error", cause)
			if u.Probe != nil {
				u.Probe(attempt, cause)
			}
		},
		Hedge: func(attempt int) {
			g.log.Debug("gateway: hedging", "attempt", attempt)
			if u.Hedge != nil {
				u.Hedge(attempt)
			}
		},
		Denied: func() {
			g.log.Warn("gateway: retry budget exhausted, not retrying")
			if u.Denied != nil {
				u.Denied()
			}
		},
		Eject: func(key string, d time.Duration) {
			g.log.Warn("gateway: endpoint ejected", "endpoint", key, "for", d)
			if u.Eject != nil {
				u.Eject(key, d)
			}
		},
		Cooldown: func(key string, d time.Duration) {
			g.log.Info("gateway: endpoint cooling down for the wait it asked", "endpoint", key, "for", d)
			if u.Cooldown != nil {
				u.Cooldown(key, d)
			}
		},
		Reject: func(err *retry.OverloadError) {
			g.log.Info("gateway: request refused by admission", "scope", err.Scope, "retry_after", err.RetryAfter)
			if u.Reject != nil {
				u.Reject(err)
			}
		},
	}
}
