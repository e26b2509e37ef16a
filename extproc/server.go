package extproc

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/httplb"
	"github.com/llmlb/llmlb/retry"
)

// Names of the endpoint picker protocol, from
// docs/proposals/004-endpoint-picker-protocol/README.md and
// pkg/epp/metadata/consts.go of kubernetes-sigs/gateway-api-inference-extension
// v1.5.0, unchanged in the proposal's latest revision (1e90962, April 2026)
// and in llm-d/llm-d-router v0.10.0 (pkg/epp/metadata/consts.go), which
// maintains the reference picker since the inference extension's v1.6.0.
const (
	// ProtocolVersion is the version of the endpoint picker protocol this
	// package implements (the proposal's version history: fallback lists
	// since v0.4.0, the served-endpoint metadata since v1.0.0; the latest
	// revision, still v1.0.0, adds that the picker MUST support the
	// streamed body modes and serve gRPC health, which cmd/llmlb-epp does).
	ProtocolVersion = "v1.0.0"
	// DestinationHeader is the request header, and the key in the
	// [MetadataNamespace] dynamic metadata, that carries the picked endpoint
	// and its fallbacks: "10.0.0.7:8000" or "10.0.0.7:8000,10.0.0.8:8000".
	DestinationHeader = "x-gateway-destination-endpoint"
	// MetadataNamespace is the dynamic metadata namespace of
	// [DestinationHeader] in responses and of [ServedKey] in requests.
	MetadataNamespace = "envoy.lb"
	// ServedKey is the key, in the [MetadataNamespace] filter metadata of the
	// response messages, under which the data plane reports the endpoint
	// that served the request.
	ServedKey = "x-gateway-destination-endpoint-served"
	// SubsetNamespace and SubsetKey locate, in the request's filter
	// metadata, the list of endpoints ("ip:port") the data plane allows the
	// picker to choose from.
	SubsetNamespace = "envoy.lb.subset_hint"
	SubsetKey       = "x-gateway-destination-endpoint-subset"
)

// DroppedReasonHeader is the header llm-d's endpoint picker adds to the
// requests it refuses (pkg/common/error/error.go of llm-d/llm-d-router
// v0.10.0, RequestDroppedReasonHeaderKey), which a [Server] adds to its
// 429 and 503 immediate responses with llm-d's values
// (RequestDroppedReason, set by pkg/epp/requestcontrol/admission.go
// translateFlowControlOutcome): "rejected-saturated" for a request shed
// under load (an admission cap reached, or the bodies and headers in
// flight over [Config.MaxBufferedBytes]), "rejected-no-endpoints" when no
// endpoint may take the request (none in the pool, none healthy, none in
// the data plane's subset hint).
const DroppedReasonHeader = "x-llm-d-request-dropped-reason"

// The values of [DroppedReasonHeader].
const (
	droppedSaturated   = "rejected-saturated"
	droppedNoEndpoints = "rejected-no-endpoints"
)

// MaxFallbacks bounds [Config.Fallbacks].
const MaxFallbacks = 16

// DefaultMaxBufferedBytes is the default of [Config.MaxBufferedBytes]: 1 GiB,
// 128 request bodies at httplb's default cap, and an eighth of the memory
// the inference extension's chart requests for its picker (8 GiB), which
// leaves room for the parser's transient copies.
const DefaultMaxBufferedBytes = 1 << 30

// DefaultBodyTimeout is the default of [Config.BodyTimeout], the default of
// gateway.Config.BodyTimeout.
const DefaultBodyTimeout = 30 * time.Second

// Sentinel errors. Errors returned by this package wrap one of them, so
// callers branch with errors.Is.
var (
	// ErrInvalidConfig: a [Config] field is missing or out of range.
	ErrInvalidConfig = errors.New("extproc: invalid config")
	// ErrStreamEnded is passed to a pick's Done when its ext_proc stream
	// ended before the response did: the client went away, the upstream
	// connection failed, or the data plane reset the stream. It wraps
	// context.Canceled when the stream was cancelled (reset), and when,
	// with response_body_mode NONE, the data plane closed the stream
	// without sending the response headers: the picker then learns nothing
	// of the response (see [Server.Process]). A stream that the data plane
	// half-closes before the response's end in any other mode ends the pick
	// with ErrStreamEnded alone, which retry.HealthOutcome rates Failed: it
	// counts against the endpoint in outlier detection.
	//
	// The picker cannot tell a client that went away from an upstream that
	// failed. Envoy's ext_proc filter closes the stream alike whatever ends
	// the HTTP request (Filter::onDestroy calls closeStreamMaybeGraceful in
	// envoyproxy/envoy source/extensions/filters/http/ext_proc/ext_proc.cc),
	// and no ext_proc message says why: a client reset mid-response, an
	// upstream reset mid-response, and a timeout all reach the picker as
	// the same close. Envoy's answer to an upstream that fails before its
	// response headers (a local reply, such as 503) is not sent to the
	// picker either, since v1.34.0 (runtime guard
	// envoy.reloadable_features.skip_ext_proc_on_local_reply,
	// changelogs/1.34.0.yaml), so it looks like a client gone before the
	// response. How the close arrives depends on the runtime guard
	// envoy.reloadable_features.ext_proc_graceful_grpc_close (v1.34.0, off
	// by default): off, Envoy half-closes the stream and resets it at once
	// (ExternalProcessorStreamImpl::close in client_impl.cc), and the pick
	// ends Failed or, if the reset is read first, Abandoned; on, Envoy
	// half-closes it and waits for the picker to end it, and the pick ends
	// Failed. So with the default classification a client that leaves
	// mid-response may count as a failure of its endpoint. A program that
	// would rather not count such ends gives its retry.Ejector a Classify
	// that rates errors wrapping ErrStreamEnded Abandoned, and then counts
	// no upstream failure that ends a stream early either; a response with
	// a 5xx status that the picker sees to its end still counts.
	ErrStreamEnded = errors.New("extproc: stream ended before the response")
	// ErrFailedOver is passed to a pick's Done when the data plane reports
	// that another endpoint of the list served the request (it failed
	// over); the request is then charged to that endpoint instead.
	ErrFailedOver = errors.New("extproc: served by a fallback endpoint")
)

// Config configures a [Server]. Only Balancer is required; every other zero
// field is a documented default.
type Config struct {
	// Balancer picks the endpoints. The key of each of its endpoints is the
	// address the data plane connects to, "host:port" (an IPv6 host in
	// brackets), which is what the protocol returns. Each pick ends with
	// its response's outcome, or with [ErrStreamEnded] when the stream ends
	// first, which outlier detection may count against the endpoint even
	// when the client went away: see ErrStreamEnded. Required.
	Balancer *llmlb.Balancer
	// Parser reads the request body into an llmlb.Request; the body cap,
	// the lesser of its cap ([httplb.Parser.MaxBodyBytes]) and 1 GiB,
	// bounds the body a stream holds, and a longer one is refused with
	// 413: a Server holds no body over 1 GiB, whatever the parser's cap.
	// Take the tenant from a header only if the gateway sets or removes
	// it ([httplb.ParserConfig.TrustTenantHeader]). Its functions see the
	// request's :path as net/http reads a request target (decoded Path,
	// RawPath, RawQuery), as behind httplb's proxy. nil means a Parser
	// with the defaults of [httplb.ParserConfig]. In BUFFERED mode a
	// whole body comes in one gRPC message: give the grpc.Server a
	// grpc.MaxRecvMsgSize a little above the body cap (grpc-go's default
	// is 4 MiB, the parser's default cap 8 MiB), or a body over the
	// server's limit fails the stream instead of getting 413; and no
	// more than that, as gRPC reads a message whole into memory before
	// the Server sees it, and one longer than the body cap is refused
	// anyway.
	Parser *httplb.Parser
	// Admission, if set, caps the requests in flight, globally and per
	// session; a refused request gets 429 with the suggested Retry-After.
	Admission *retry.Admission
	// Fallbacks is the number of endpoints listed after the picked one, for
	// a data plane that retries down the list when an endpoint cannot be
	// reached: the healthy endpoints with the fewest requests in flight,
	// ties broken at random. 0, the default, lists only the picked endpoint,
	// as the inference extension's default picker does; at most
	// [MaxFallbacks]. Set it only for a data plane that reads the list (one
	// using Envoy's override_host load balancing policy): an ORIGINAL_DST
	// cluster that routes on the header or the metadata parses a single
	// address (envoyproxy/envoy
	// source/extensions/clusters/original_dst/original_dst_cluster.cc), and
	// fails every request given a list.
	Fallbacks int
	// Logger receives refusals (Info), internal failures (Error) and
	// protocol violations (Warn). nil means [slog.Default].
	Logger *slog.Logger
	// Rand breaks ties among fallbacks. It is serialized by the Server.
	// nil means math/rand/v2's global generator.
	Rand rand.Source
	// MaxBufferedBytes bounds the memory taken at once by the request
	// bodies and headers the Server's streams hold, whatever the number of
	// streams and connections. A stream holds its request headers from
	// their arrival, and its body from its first byte, until the route is
	// sent (or the request refused); a request whose headers or body would
	// take the total over the bound is refused with 429 and a Retry-After
	// of one second, as the protocol answers a request shed under load. The
	// start of the answer to an OpenAI Responses API request, up to 64 KiB
	// that a stream holds until it has read the response's id, counts too;
	// when it does not fit, the id is not learned and the response goes
	// on. 0 means [DefaultMaxBufferedBytes]; otherwise it must be at least
	// the body cap (see Parser), so that one body at the cap fits, and
	// with its headers when the bound exceeds the cap by their size (which
	// Envoy bounds with max_request_headers_kb, 60 KiB by default).
	MaxBufferedBytes int64
	// BodyTimeout bounds the time from a stream's first message until its
	// request is routed: a client that sends its body slower, holding the
	// stream and its share of MaxBufferedBytes, gets 408 Request Timeout,
	// the status Envoy's own request_timeout answers, and the body and
	// headers are let go at once. The stream itself ends when the data plane closes it,
	// which Envoy does after an immediate response. 0 means
	// [DefaultBodyTimeout]; a negative value sets no deadline.
	BodyTimeout time.Duration
	// Protocol holds the body modes of the ext_proc filter, for a data
	// plane that does not announce them: Envoy sends its
	// processing_mode's request_body_mode and response_body_mode in the
	// protocol_config of each stream's first message since v1.34.0, and
	// older versions send none. Set it to the filter's modes when they are
	// not FULL_DUPLEX_STREAMED: an Envoy configured BUFFERED waits for the
	// answer to the request headers, which a Server that takes the mode to
	// be FULL_DUPLEX_STREAMED holds until the body is complete, and the
	// request fails after BodyTimeout. A stream's protocol_config, when
	// sent, overrides it. A mode other than NONE, STREAMED, BUFFERED,
	// BUFFERED_PARTIAL and FULL_DUPLEX_STREAMED (GRPC) is refused. nil
	// means FULL_DUPLEX_STREAMED both ways, the mode the endpoint picker
	// protocol requires, and the only one the reference picker serves (it
	// reads no protocol_config: pkg/epp/handlers/server.go of
	// llm-d/llm-d-router v0.10.0).
	Protocol *extprocv3.ProtocolConfiguration
}

// Server is an Envoy external processor that picks an endpoint for each
// request. Create one with [NewServer] and register it on a grpc.Server with
// extprocv3.RegisterExternalProcessorServer. It is safe for concurrent use.
type Server struct {
	b         *llmlb.Balancer
	parser    *httplb.Parser
	admission *retry.Admission // nil: no caps
	fallbacks int
	log       *slog.Logger
	maxBody   int

	maxBuffered int64        // bounds buffered
	buffered    atomic.Int64 // bytes of request bodies, and of response id scans, the streams hold

	bodyTimeout time.Duration // 0: no deadline

	// The body modes of a stream whose first message announces none
	// (Config.Protocol).
	reqMode, respMode filterv3.ProcessingMode_BodySendMode

	// afterFunc arms a stream's body deadline: it calls f after d, unless
	// the returned stop is called first. time.AfterFunc unless a test
	// replaces it.
	afterFunc func(d time.Duration, f func()) (stop func() bool)

	ids *responseIDs // the endpoints that produced the response ids seen

	randMu sync.Mutex // protects rnd
	rnd    *rand.Rand // nil: the global generator
}

// NewServer returns a Server configured by cfg, or an error wrapping
// [ErrInvalidConfig].
func NewServer(cfg Config) (*Server, error) {
	if cfg.Balancer == nil {
		return nil, fmt.Errorf("%w: Balancer is nil", ErrInvalidConfig)
	}
	if cfg.Fallbacks < 0 || cfg.Fallbacks > MaxFallbacks {
		return nil, fmt.Errorf("%w: Fallbacks %d is outside [0, %d]", ErrInvalidConfig, cfg.Fallbacks, MaxFallbacks)
	}
	s := &Server{b: cfg.Balancer, parser: cfg.Parser, admission: cfg.Admission, fallbacks: cfg.Fallbacks, log: cfg.Logger,
		ids: newResponseIDs()}
	if s.parser == nil {
		p, err := httplb.NewParser(httplb.ParserConfig{})
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
		}
		s.parser = p
	}
	s.maxBody = int(min(s.parser.MaxBodyBytes(), int64(maxBodyLimit)))
	switch s.maxBuffered = cfg.MaxBufferedBytes; {
	case s.maxBuffered == 0:
		s.maxBuffered = DefaultMaxBufferedBytes // at least maxBodyLimit
	case s.maxBuffered < int64(s.maxBody):
		return nil, fmt.Errorf("%w: MaxBufferedBytes %d is below the body cap %d", ErrInvalidConfig, cfg.MaxBufferedBytes, s.maxBody)
	}
	switch s.bodyTimeout = cfg.BodyTimeout; {
	case s.bodyTimeout == 0:
		s.bodyTimeout = DefaultBodyTimeout
	case s.bodyTimeout < 0:
		s.bodyTimeout = 0
	}
	s.reqMode, s.respMode = fullDuplex, fullDuplex
	if pc := cfg.Protocol; pc != nil {
		for _, m := range []filterv3.ProcessingMode_BodySendMode{pc.GetRequestBodyMode(), pc.GetResponseBodyMode()} {
			if !supportedMode(m) {
				return nil, fmt.Errorf("%w: Protocol has an unsupported body mode %v", ErrInvalidConfig, m)
			}
		}
		s.reqMode, s.respMode = pc.GetRequestBodyMode(), pc.GetResponseBodyMode()
	}
	s.afterFunc = func(d time.Duration, f func()) func() bool { return time.AfterFunc(d, f).Stop }
	if s.log == nil {
		s.log = slog.Default()
	}
	if cfg.Rand != nil {
		s.rnd = rand.New(cfg.Rand)
	}
	return s, nil
}

// maxBodyLimit bounds the body a stream gathers whatever the parser's cap.
const maxBodyLimit = 1 << 30

// errResponseUnseen finishes the pick of a request whose stream the data
// plane closed, with response_body_mode NONE, before any response message:
// with response_header_mode SKIP (and response_trailer_mode SKIP, its
// default) Envoy sends the picker nothing of the response, and closes the
// stream as soon as it has the answer to the request's last message
// (Filter::closeGrpcStreamIfLastRespReceived in envoyproxy/envoy
// source/extensions/filters/http/ext_proc/ext_proc.cc at 294012761b5c,
// runtime feature envoy.reloadable_features.ext_proc_stream_close_optimization;
// without it, when the request is over). The header modes are not in the
// protocol_config of the stream's first message, which holds the body
// modes alone (envoy/service/ext_proc/v3/external_processor.proto
// ProtocolConfiguration, go-control-plane envoy v1.40.0), so such a close
// cannot be told from a client that went away before the response
// (response_header_mode SEND, processing_mode.proto). Either way the
// endpoint's answer is unknown: the error wraps context.Canceled, which
// outlier detection (retry.HealthOutcome: Abandoned) and the observers
// count as neither a success nor a failure of the endpoint, and not nil,
// which would claim an answer (llmlb.Pick.Done) the picker never saw.
var errResponseUnseen = fmt.Errorf("%w: the response is not sent to the picker (response_body_mode NONE): %w", ErrStreamEnded, context.Canceled)

// Process serves one ext_proc stream, the life of one HTTP request: it
// returns when the data plane closes the stream (nil), when the stream's
// context ends (nil), after an immediate response (nil), or on a protocol
// violation or a failed send (a gRPC status error). Whatever ends the
// stream, the request's pick is finished and its admission released before
// Process returns. With response_body_mode NONE the data plane's close of
// the stream is the response's end: after the response headers it
// completes the pick (a 2xx as a success); before them, the response
// headers not sent to the picker (response_header_mode SKIP) or the client
// gone, it finishes the pick with an error wrapping [ErrStreamEnded] and
// context.Canceled, as neither a success nor a failure.
//
// A request not routed within [Config.BodyTimeout] of the stream's first
// message is answered 408 from a timer's goroutine, while this one waits
// for the data plane to close the stream.
func (s *Server) Process(srv extprocv3.ExternalProcessor_ProcessServer) error {
	st := &stream{s: s, srv: srv, ctx: srv.Context(), reqMode: s.reqMode, respMode: s.respMode}
	var cause error
	defer func() {
		st.mu.Lock()
		defer st.mu.Unlock()
		st.closed = true
		if st.stopTimer != nil {
			st.stopTimer()
		}
		st.end(cause)
		st.dropBody()
		st.dropHeaders()
		st.dropScan()
	}()
	for {
		m, err := srv.Recv()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			cause = st.cause(err)
			if cause == context.Canceled {
				return nil
			}
			return err
		}
		stop, err := st.handleLocked(m)
		if err != nil {
			// A send fails too when the data plane cancels the stream.
			cause = st.cause(err)
			return err
		}
		if stop {
			return nil
		}
	}
}

// handleLocked handles m under st.mu, and arms the body deadline when the
// request is not routed by its first message. It reports whether the stream
// is over: an immediate response was sent, by m's answer or by the deadline.
func (st *stream) handleLocked(m *extprocv3.ProcessingRequest) (bool, error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.expired {
		return true, nil
	}
	stop, err := st.handle(m)
	if err == nil && !stop && !st.routed && st.stopTimer == nil && st.s.bodyTimeout > 0 {
		st.stopTimer = st.s.afterFunc(st.s.bodyTimeout, st.expire)
	}
	return stop, err
}

// expire answers 408 to a request not routed by its deadline and lets its
// body and headers go. It runs on the timer's goroutine.
func (st *stream) expire() {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.closed || st.routed || st.expired {
		return
	}
	st.expired = true
	st.routed = true // no route may follow
	st.dropBody()
	err := st.refuse(errBodyTimeout)
	st.dropHeaders() // after the answer, which names the request id
	if err != nil {
		st.s.log.Warn("extproc: the body deadline's answer was not sent", "request_id", loggable(st.requestID), "error", err)
	}
}

// cause returns what ended the stream when err did: context.Canceled if the
// data plane cancelled the stream (its context ended, or err is gRPC's
// CANCELLED), else err.
func (st *stream) cause(err error) error {
	if st.ctx.Err() != nil || status.Code(err) == codes.Canceled {
		return context.Canceled
	}
	return err
}

// protocolError is the gRPC status for a message the protocol does not
// allow at that point of the stream.
func protocolError(format string, args ...any) error {
	return status.Errorf(codes.FailedPrecondition, "extproc: "+format, args...)
}

// fallbacksFor returns up to s.fallbacks member keys other than primary
// whose host allowed holds (any, if allowed is nil), healthy, fewest requests
// in flight first, ties at random. The hosts are matched here, on the
// members of now, because the pool may have grown since the pick.
func (s *Server) fallbacksFor(primary string, allowed map[string]bool) []string {
	stats := s.b.Stats()
	cand := stats[:0]
	for _, e := range stats {
		if e.Key != primary && e.Healthy && (allowed == nil || allowed[hostOf(e.Key)]) {
			cand = append(cand, e)
		}
	}
	s.shuffle(len(cand), func(i, j int) { cand[i], cand[j] = cand[j], cand[i] })
	slices.SortStableFunc(cand, func(a, b llmlb.EndpointStats) int { return cmp.Compare(a.Outstanding, b.Outstanding) })
	out := make([]string, 0, min(len(cand), s.fallbacks))
	for _, e := range cand[:min(len(cand), s.fallbacks)] {
		out = append(out, e.Key)
	}
	return out
}

// reserve charges n bytes of body to the Server's budget and reports
// whether they fit.
func (s *Server) reserve(n int64) bool {
	for {
		cur := s.buffered.Load()
		if cur+n > s.maxBuffered {
			return false
		}
		if s.buffered.CompareAndSwap(cur, cur+n) {
			return true
		}
	}
}

func (s *Server) shuffle(n int, swap func(i, j int)) {
	if s.rnd == nil {
		rand.Shuffle(n, swap)
		return
	}
	s.randMu.Lock()
	s.rnd.Shuffle(n, swap)
	s.randMu.Unlock()
}
