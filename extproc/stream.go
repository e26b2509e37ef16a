package extproc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/textproto"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/httplb"
	"github.com/llmlb/llmlb/retry"
)

const (
	fullDuplex   = filterv3.ProcessingMode_FULL_DUPLEX_STREAMED
	buffered     = filterv3.ProcessingMode_BUFFERED
	bufPartial   = filterv3.ProcessingMode_BUFFERED_PARTIAL
	streamedMode = filterv3.ProcessingMode_STREAMED
	modeNone     = filterv3.ProcessingMode_NONE
)

// supportedMode reports whether m is a body mode a Server serves: NONE,
// STREAMED, BUFFERED, BUFFERED_PARTIAL or FULL_DUPLEX_STREAMED. GRPC, which
// envoyproxy/envoy api/envoy/extensions/filters/http/ext_proc/v3/processing_mode.proto
// adds (not implemented as of go-control-plane envoy v1.40.0), de-frames
// gRPC messages, and any other value is unknown.
func supportedMode(m filterv3.ProcessingMode_BodySendMode) bool {
	switch m {
	case modeNone, streamedMode, buffered, bufPartial, fullDuplex:
		return true
	}
	return false
}

// stream is the state of one ext_proc stream: one HTTP request and its
// response. It is used by the goroutine of Server.Process and, until the
// request is routed, by the body deadline's timer.
//
// The body deadline's timer runs expire on its own goroutine: mu serializes
// it with the messages' handling, so every field below is guarded by mu once
// the timer is armed.
type stream struct {
	s   *Server
	srv extprocv3.ExternalProcessor_ProcessServer
	ctx context.Context

	mu        sync.Mutex
	stopTimer func() bool // stops the body deadline; nil until armed
	expired   bool        // the body deadline passed and 408 was sent
	closed    bool        // Process returned

	// The body modes, from the first message's protocol_config; without
	// one, Config.Protocol's.
	reqMode, respMode filterv3.ProcessingMode_BodySendMode
	started           bool // a message was received
	observe           bool // observability mode: the data plane ignores answers

	// The request.
	headers     bool        // request headers received, or skipped by the data plane
	skipped     bool        // the data plane sent a body without headers
	reqEnded    bool        // the request's end of stream was seen (headers, body or trailers)
	hdr         http.Header // canonical keys; nil until a header is read, and once routed (dropHeaders)
	method      string
	rawPath     string  // the :path as sent
	target      url.URL // the :path as net/http reads it (see requestURL)
	validPath   bool    // net/http would accept the :path: target.Path is its decoded path
	authority   string
	requestID   string          // cut to maxLogged+1 bytes once routed
	body        []byte          // the request body gathered; nil once routed
	held        int64           // bytes of body charged to the Server's budget
	hdrHeld     int64           // bytes of request headers charged to the Server's budget; 0 once routed
	createsResp bool            // the request creates an OpenAI Responses API response (known once routed)
	bodyMsgs    int             // request body messages received
	subset      *structpb.Value // the data plane's subset hint; nil: none
	routed      bool            // the route was sent (or the request refused)
	lr          llmlb.Request   // what the pick was made with
	pick        llmlb.Pick
	picked      bool
	release     func() // admission's release; nil when not admitted
	primary     string
	served      bool          // the served endpoint was read from the metadata
	respStarted bool          // response headers (or body, with headers skipped) seen
	status      int           // the response's :status; 0 while unknown
	sse         bool          // the response is a server-sent event stream
	respEncoded bool          // the response body is compressed
	respLength  bool          // the response has a Content-Length
	restore     *modelRestore // renames the response's model back; nil: no rename
	idScan      *idScan       // finds the id of a Responses API response; nil: none to find; stopped when Process returns
	events      firstEvent
	output      httplb.OutputCounter // counts the response's output tokens for the pick
	generated   int                  // the output tokens counted so far
	first       bool                 // FirstToken was called
	finished    bool                 // Done was called
}

// handle processes one message. It reports whether the stream is over (an
// immediate response was sent).
func (st *stream) handle(m *extprocv3.ProcessingRequest) (bool, error) {
	if !st.started {
		st.started = true
		if pc := m.GetProtocolConfig(); pc != nil {
			st.reqMode, st.respMode = pc.GetRequestBodyMode(), pc.GetResponseBodyMode()
			if !supportedMode(st.reqMode) || !supportedMode(st.respMode) {
				// GRPC is answered with StreamedBodyResponse messages
				// (processing_mode.proto): answered as another mode,
				// the request would fail for no reason the data plane
				// could name.
				return false, protocolError("unsupported body modes %v and %v", st.reqMode, st.respMode)
			}
		}
	}
	st.observe = m.GetObservabilityMode()
	switch v := m.GetRequest().(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		return st.requestHeaders(m, v.RequestHeaders)
	case *extprocv3.ProcessingRequest_RequestBody:
		return st.requestBody(m, v.RequestBody)
	case *extprocv3.ProcessingRequest_RequestTrailers:
		return st.requestTrailers(m)
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		return false, st.responseHeaders(m, v.ResponseHeaders)
	case *extprocv3.ProcessingRequest_ResponseBody:
		return false, st.responseBody(m, v.ResponseBody)
	case *extprocv3.ProcessingRequest_ResponseTrailers:
		return false, st.responseTrailers(m)
	}
	return false, nil // a message with no request part (flow control): nothing to answer
}

// requestHeaders routes at once a request without a body, or one whose body
// the picker will not see before the headers go upstream (body modes NONE
// and STREAMED); it lets the headers of a BUFFERED body through and holds
// those of a FULL_DUPLEX_STREAMED one until the body is complete, as the
// v1.5.0 EPP does (pkg/epp/handlers/server.go: the headers response is
// sent with the body responses).
func (st *stream) requestHeaders(m *extprocv3.ProcessingRequest, h *extprocv3.HttpHeaders) (bool, error) {
	if st.headers {
		return false, protocolError("request headers after the request began")
	}
	st.headers = true
	st.noteSubset(m)
	if !st.readHeaders(h.GetHeaders()) {
		return true, st.refuse(errBodyBudget)
	}
	if h.GetEndOfStream() {
		st.reqEnded = true
		return st.route(routeHeaders)
	}
	switch st.reqMode {
	case fullDuplex:
		return false, nil
	case buffered, bufPartial:
		// The route is set in a later answer, or, for a request that
		// ends with trailers and no body, only in the metadata: a
		// destination the client sent must not reach the data plane.
		return false, st.send(headersResponse(true, stripDestination(), nil))
	}
	return st.route(routeHeaders)
}

func (st *stream) requestBody(m *extprocv3.ProcessingRequest, b *extprocv3.HttpBody) (bool, error) {
	if !st.headers { // request_header_mode SKIP
		st.headers, st.skipped = true, true
	}
	if st.reqEnded {
		return false, protocolError("request body after the request ended")
	}
	st.reqEnded = b.GetEndOfStream()
	st.noteSubset(m)
	st.bodyMsgs++
	chunk := b.GetBody()
	if st.routed { // the route is set: pass the rest through
		if st.reqMode == fullDuplex {
			return false, st.sendChunks(true, chunk, b.GetEndOfStream())
		}
		return false, st.send(bodyResponse(true, nil, nil))
	}
	if len(st.body)+len(chunk) > st.s.maxBody {
		return true, st.refuse(errBodyOverCap(st.s.maxBody))
	}
	switch st.reqMode {
	case fullDuplex:
		if st.body == nil && b.GetEndOfStream() {
			// The whole body in one message: no copy.
			if !st.charge(int64(len(chunk))) {
				return true, st.refuse(st.budgetRefusal(len(st.body) + len(chunk)))
			}
			st.body = chunk
		} else if !st.appendBody(chunk) {
			return true, st.refuse(st.budgetRefusal(len(st.body) + len(chunk)))
		}
		if b.GetEndOfStream() {
			return st.route(routeDuplexEnd)
		}
		return false, nil
	case buffered, bufPartial:
		// The whole body (or, BUFFERED_PARTIAL, as much as the data plane
		// buffers) in one message; route on it whatever end_of_stream says.
		if !st.charge(int64(len(chunk))) {
			return true, st.refuse(st.budgetRefusal(len(st.body) + len(chunk)))
		}
		st.body = chunk
		return st.route(routeBuffered)
	}
	return st.route(routeBuffered)
}

func (st *stream) requestTrailers(m *extprocv3.ProcessingRequest) (bool, error) {
	st.reqEnded = true
	st.noteSubset(m)
	if !st.headers { // request_header_mode SKIP: no headers may follow
		st.headers, st.skipped = true, true
	}
	if !st.routed {
		if st.reqMode == fullDuplex {
			// Trailers end a FULL_DUPLEX_STREAMED body whose last chunk
			// had no end_of_stream (processing_mode.proto).
			return st.route(routeDuplexTrailers)
		}
		// The headers were answered (BUFFERED) or skipped, and no body
		// came: the route goes in the trailers' answer's metadata, the
		// only answer owed.
		return st.route(routeTrailers)
	}
	return false, st.send(trailersResponse(true))
}

func (st *stream) responseHeaders(m *extprocv3.ProcessingRequest, h *extprocv3.HttpHeaders) error {
	if !st.routed {
		return protocolError("response headers before the request was routed")
	}
	if st.respStarted {
		return protocolError("response headers twice")
	}
	st.respStarted = true
	st.noteServed(m)
	var content http.Header // what the output counter needs to know
	encoded := false
	for _, hv := range h.GetHeaders().GetHeaders() {
		switch hv.GetKey() {
		case ":status":
			st.status, _ = strconv.Atoi(headerValue(hv))
		case "content-type":
			st.sse = strings.Contains(strings.ToLower(headerValue(hv)), "text/event-stream")
			content = addHeader(content, "Content-Type", headerValue(hv))
		case "content-encoding":
			v := headerValue(hv)
			encoded = encoded || !strings.EqualFold(strings.TrimSpace(v), "identity")
			content = addHeader(content, "Content-Encoding", v)
		case "content-length":
			st.respLength = true
		}
	}
	st.respEncoded = encoded
	if st.createsResp && st.success() && !encoded {
		// Remember which endpoint produced the response, which a
		// request continuing it must go back to.
		st.idScan = &idScan{srv: st.s, sse: st.sse}
	}
	// A compressed event stream's events cannot be seen in its bytes: its
	// first byte is its first token, as for any other body.
	st.sse = st.sse && !encoded
	if content != nil {
		st.output = httplb.NewOutputCounter(content)
	}
	if h.GetEndOfStream() {
		st.complete()
	}
	return st.send(headersResponse(false, nil, nil))
}

func (st *stream) responseBody(m *extprocv3.ProcessingRequest, b *extprocv3.HttpBody) error {
	if !st.routed {
		return protocolError("response body before the request was routed")
	}
	st.respStarted = true
	st.noteServed(m)
	st.observeBody(b.GetBody())
	if st.idScan != nil {
		if id, ok := st.idScan.feed(b.GetBody(), b.GetEndOfStream()); ok {
			st.s.ids.learn(id, st.primary)
		}
	}
	if b.GetEndOfStream() {
		st.complete()
	}
	r := st.restoreResponse()
	switch {
	case st.respMode == fullDuplex && r != nil:
		return st.sendChunks(false, r.feed(b.GetBody(), b.GetEndOfStream()), b.GetEndOfStream())
	case st.respMode == fullDuplex:
		return st.sendChunks(false, b.GetBody(), b.GetEndOfStream())
	case st.respMode == buffered && r != nil:
		// The whole body, in one message.
		if out := r.feed(b.GetBody(), true); !bytes.Equal(out, b.GetBody()) {
			common := &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_Body{Body: out}}}
			if st.respLength {
				// Envoy rejects a buffered body whose length
				// differs from the Content-Length it is sent with
				// (processing_mode.proto).
				common.HeaderMutation = &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{
					setHeader("Content-Length", strconv.Itoa(len(out)))}}
			}
			return st.send(bodyResponse(false, common, nil))
		}
	case (st.respMode == streamedMode || st.respMode == bufPartial) && r != nil:
		// Envoy replaces each piece it sends with the body mutation
		// answered to it (ProcessorState::handleBodyResponse, in
		// envoy's source/extensions/filters/http/ext_proc/processor_state.cc
		// at 055a650d3bfa): a STREAMED chunk, or the one
		// BUFFERED_PARTIAL piece, the rest of the body then passing
		// unseen. The piece is renamed on its own, nothing held back: a
		// tail held could be lost, as a response that ends with
		// trailers has no body chunk with end_of_stream, and an answer
		// to trailers carries no body. Envoy removes Content-Length in
		// these modes (processor_state.h shouldRemoveContentLength).
		if out := r.feed(b.GetBody(), true); !bytes.Equal(out, b.GetBody()) {
			common := &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_Body{Body: out}}}
			return st.send(bodyResponse(false, common, nil))
		}
	}
	return st.send(bodyResponse(false, nil, nil))
}

// restoreResponse returns the rename of the response's model back to the
// client's, nil if there is none to make: the request's model was not
// rewritten, or the response body is compressed. It is made in body modes
// FULL_DUPLEX_STREAMED and BUFFERED over the whole body, and in STREAMED
// and BUFFERED_PARTIAL within each piece the picker is sent.
func (st *stream) restoreResponse() *modelRestore {
	if st.restore == nil || st.respEncoded {
		return nil
	}
	return st.restore
}

func (st *stream) responseTrailers(m *extprocv3.ProcessingRequest) error {
	if !st.routed {
		return protocolError("response trailers before the request was routed")
	}
	st.respStarted = true
	st.noteServed(m)
	st.complete()
	if r := st.restoreResponse(); r != nil && st.respMode == fullDuplex && len(r.carry) > 0 {
		// The body ended without end_of_stream: the tail held back
		// goes before the trailers.
		if err := st.sendChunks(false, r.feed(nil, true), false); err != nil {
			return err
		}
	}
	return st.send(trailersResponse(false))
}

// readHeaders keeps the request's headers for the parser: pseudo-headers as
// the method, URL (see requestURL) and authority, the others under
// canonical keys. What it keeps is charged to the Server's budget until the
// request is routed (see dropHeaders); it reports whether the budget had
// room, and keeps no header map if not.
func (st *stream) readHeaders(hm *corev3.HeaderMap) bool {
	var path string
	var size int64
	for _, hv := range hm.GetHeaders() {
		k, v := hv.GetKey(), headerValue(hv)
		if strings.HasPrefix(k, ":") {
			switch k {
			case ":method":
				st.method = v
			case ":path":
				path = v
			case ":authority":
				st.authority = v
			}
			continue
		}
		if st.hdr == nil {
			st.hdr = make(http.Header, len(hm.GetHeaders()))
		}
		st.hdr.Add(textproto.CanonicalMIMEHeaderKey(k), v)
		size += int64(len(k)+len(v)) + headerEntryBytes
		if k == "x-request-id" || k == "X-Request-Id" {
			st.requestID = v
		}
	}
	// The path is kept twice: as sent, and as the URL net/http reads.
	size += int64(len(st.method)+2*len(path)+len(st.authority)) + headerEntryBytes
	if !st.s.reserve(size) {
		st.hdr = nil // the refusal names the request id
		return false
	}
	st.hdrHeld = size
	st.rawPath = path
	st.target, st.validPath = requestURL(path)
	return true
}

// headerEntryBytes approximates what a header takes in memory beyond its
// name and value: the strings' and the value slice's headers and the
// map's slot. It is charged with each header kept, so that a request of
// many empty headers counts too.
const headerEntryBytes = 64

// dropHeaders lets the request's headers and subset hint go, which nothing
// reads once the request is routed but its request id, cut to what a log
// line shows, and returns their bytes to the Server's budget. The stream
// then holds no more of the request than its parsed form (lr).
func (st *stream) dropHeaders() {
	st.hdr, st.method, st.rawPath, st.authority, st.subset = nil, "", "", "", nil
	st.target, st.validPath = url.URL{}, false
	if len(st.requestID) > maxLogged {
		st.requestID = strings.Clone(st.requestID[:maxLogged+1]) // loggable marks the cut
	}
	if st.hdrHeld != 0 {
		st.s.buffered.Add(-st.hdrHeld)
		st.hdrHeld = 0
	}
}

// headerValue returns a header's value: raw_value, which Envoy sets, else
// value (pkg/common/envoy/headers.go GetHeaderValue, v1.5.0).
func headerValue(hv *corev3.HeaderValue) string {
	if raw := hv.GetRawValue(); len(raw) > 0 {
		return string(raw)
	}
	return hv.GetValue()
}

// httpRequest returns the request as the parser sees it: its URL is the
// :path read as net/http reads a request's target (see requestURL), and its
// RequestURI the :path as sent, as net/http's server sets it, so that a
// [httplb.ParserConfig.Tenant] reads the same Path, RawPath, RawQuery and
// RequestURI here as behind httplb's proxy.
func (st *stream) httpRequest() *http.Request {
	u := st.target // a copy: what the parser does with it is not read back
	r := &http.Request{Method: st.method, Host: st.authority, Header: st.hdr, URL: &u,
		RequestURI: st.rawPath, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1, Body: http.NoBody}
	if r.Header == nil {
		r.Header = http.Header{}
	}
	return r.WithContext(st.ctx)
}

// requestURL returns the URL of a request whose :path pseudo-header is p, as
// net/http reads a request's target (url.ParseRequestURI, called by
// readRequest in net/http/request.go and, for HTTP/2, by NewServerRequest in
// net/http/internal/httpcommon/httpcommon.go, Go 1.26), and so as httplb's
// parser is given it: Path decoded, as the engines' routers (Starlette's)
// match it ("%2F" a slash, any other escape the byte it encodes), RawPath
// set when p's escapes are not the default ones, RawQuery the query,
// unchecked.
//
// ok is false, and the URL has Path p less its query and RawQuery the
// query, for a :path that net/http refuses (an invalid escape in the path,
// "%", "%2" or "%zz", or a control character), for one not in origin form
// (a '/' and the path, RFC 9113 section 8.3.1: what Envoy sends), and for
// an empty one (the request headers skipped, or without :path). Such a
// request is routed as any other, its body parsed, but addresses no stored
// response, as httplb never reads such a path.
func requestURL(p string) (u url.URL, ok bool) {
	if strings.HasPrefix(p, "/") {
		if pu, err := url.ParseRequestURI(p); err == nil {
			return *pu, true
		}
	}
	u.Path, u.RawQuery, _ = strings.Cut(p, "?")
	return u, false
}

type routeKind int

const (
	routeHeaders        routeKind = iota // answer the request headers
	routeBuffered                        // answer the buffered body
	routeDuplexEnd                       // answer headers and stream the body back, end_of_stream set
	routeDuplexTrailers                  // answer headers, stream the body back, answer the trailers
	routeTrailers                        // answer the trailers (the headers were answered or skipped)
)

// route picks the endpoint and sends it to the data plane in the answer
// kind calls for, or refuses the request with an immediate response (and
// then reports that the stream is over).
func (st *stream) route(kind routeKind) (bool, error) {
	if st.routed {
		return false, protocolError("the request was routed already")
	}
	st.routed = true
	if st.stopTimer != nil {
		st.stopTimer()
	}
	defer st.dropBody() // once the body is parsed and sent back
	if path, ok := st.decodedPath(); ok {
		st.createsResp = isResponsesCreate(st.method, path)
	}
	defer st.dropHeaders()
	rewritten, err := st.applyRewrite(kind)
	if err != nil {
		return true, st.refuse(err)
	}
	dest, err := st.decide()
	if err != nil {
		if ctxErr := st.ctx.Err(); ctxErr != nil {
			return true, nil // the data plane is gone; nothing to answer
		}
		return true, st.refuse(err)
	}
	md := destinationMetadata(dest)
	switch kind {
	case routeBuffered:
		if rewritten {
			common := routeMutation(dest, len(st.body))
			common.BodyMutation = &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_Body{Body: st.body}}
			return false, st.send(bodyResponse(true, common, md))
		}
		return false, st.send(bodyResponse(true, routeMutation(dest, -1), md))
	case routeTrailers:
		m := trailersResponse(true)
		m.DynamicMetadata = md
		return false, st.send(m)
	case routeDuplexEnd, routeDuplexTrailers:
		// Content-Length as the v1.5.0 EPP sets it (pkg/epp/handlers/request.go
		// generateHeaders): Envoy drops it in FULL_DUPLEX_STREAMED mode, and
		// the body is returned whole and unchanged.
		contentLength := -1
		if st.bodyMsgs > 0 {
			contentLength = len(st.body)
		}
		if !st.skipped {
			if err := st.send(headersResponse(true, routeMutation(dest, contentLength), md)); err != nil {
				return false, err
			}
			md = nil
		}
		if st.bodyMsgs > 0 {
			var mut *extprocv3.CommonResponse
			if st.skipped {
				// The headers were not sent to the picker
				// (request_header_mode SKIP): the first body answer
				// sets the route header, overwriting any the client
				// sent, for a data plane that still holds the headers.
				mut = routeMutation(dest, -1)
			}
			if err := st.sendChunksMD(true, st.body, kind == routeDuplexEnd, md, mut); err != nil {
				return false, err
			}
			md = nil
		}
		if kind == routeDuplexTrailers {
			// With the headers skipped and no body, the trailers' answer
			// is the only one owed: it carries the route.
			m := trailersResponse(true)
			m.DynamicMetadata = md
			return false, st.send(m)
		}
		return false, nil
	}
	return false, st.send(headersResponse(true, routeMutation(dest, -1), md))
}

// applyRewrite renames the body's model as [ModelRewriteHeader] asks, before
// the body is parsed, so that the new name is also what the request is
// routed and its prefix salted with, as in llm-d (its scheduler's
// TargetModel). Only a whole body is rewritten: a BUFFERED_PARTIAL body
// whose rest streams past the picker, or a body the picker does not see
// (body modes STREAMED and NONE), goes upstream as the client sent it. It
// reports whether st.body changed.
func (st *stream) applyRewrite(kind routeKind) (bool, error) {
	if kind != routeBuffered && kind != routeDuplexEnd && kind != routeDuplexTrailers ||
		st.reqMode == bufPartial && !st.reqEnded || st.bodyMsgs == 0 || st.skipped {
		return false, nil
	}
	model := st.rewriteModel()
	if model == "" {
		return false, nil
	}
	if len(model) > maxRewriteModel {
		return false, errRewriteTooLong
	}
	edit, ok, err := planModel(st.body, model)
	if err != nil || !ok {
		return false, err // not a JSON object, or the model already
	}
	if edit.size > st.s.maxBody {
		return false, errBodyOverCap(st.s.maxBody)
	}
	if !st.charge(int64(edit.size)) {
		return false, errBodyBudget
	}
	if len(edit.spans) > 0 {
		// The response names the model the request was sent with:
		// rename it back to the client's, the value a JSON parser reads
		// (the last member).
		sp := edit.spans[len(edit.spans)-1]
		st.restore = newModelRestore(st.body[sp[0]:sp[1]], edit.val)
	}
	st.body = edit.apply(st.body)
	return true, nil
}

// decide parses the request, admits it, picks its endpoint and returns the
// destination list.
func (st *stream) decide() (string, error) {
	r := st.httpRequest()
	lr, err := st.s.parser.ParseBody(r, st.body)
	if err != nil {
		return "", err
	}
	if st.s.admission != nil {
		release, err := st.s.admission.Acquire(admissionKey(&lr))
		if err != nil {
			return "", err
		}
		st.release = release
	}
	var allowed map[string]bool // the hint's hosts; nil: no hint
	if st.subset != nil {
		if allowed, lr.Exclude, err = st.subsetExclusions(); err != nil {
			return "", err
		}
	}
	pinned := false
	if id, ok := st.responseRef(); ok {
		if key, ok := st.s.ids.lookup(id); ok {
			pinned = st.s.pinTo(&lr, key, allowed)
		}
	}
	p, err := st.s.pickAllowed(st.ctx, &lr, allowed)
	if err != nil {
		return "", err
	}
	if p, err = st.s.pickHealthy(st.ctx, &lr, p, allowed); err != nil {
		return "", err
	}
	lr.Exclude = nil
	st.lr, st.pick, st.picked = lr, p, true
	st.primary = p.Endpoint().Key()
	if st.s.fallbacks == 0 || pinned {
		// Any other endpoint would answer 404 to a request for a
		// stored response.
		return st.primary, nil
	}
	fb := st.s.fallbacksFor(st.primary, allowed)
	return strings.Join(append([]string{st.primary}, fb...), ","), nil
}

// responseRef returns the id of the stored response the request continues
// (a Responses API request's "previous_response_id") or addresses by its
// path (retrieve, cancel, delete), if any.
func (st *stream) responseRef() (string, bool) {
	path, ok := st.decodedPath()
	if !ok {
		return "", false
	}
	if id, ok := storedResponseID(st.method, path); ok {
		return id, true
	}
	if isResponsesCreate(st.method, path) {
		return previousResponseID(st.body)
	}
	return "", false
}

// decodedPath returns the request's path without its query, decoded as
// the parser is given it (see requestURL); ok is false if net/http would
// refuse the :path.
func (st *stream) decodedPath() (string, bool) {
	return st.target.Path, st.validPath
}

// pickAllowed picks an endpoint for lr whose host allowed holds (any, if
// allowed is nil). lr.Exclude, the members outside allowed, is a snapshot
// of the pool: a member that joined since may be picked, and is then
// excluded in turn and the request picked again, so that the protocol's
// rule that the picker MUST only select endpoints from the subset holds
// while the pool scales.
func (s *Server) pickAllowed(ctx context.Context, lr *llmlb.Request, allowed map[string]bool) (llmlb.Pick, error) {
	if allowed == nil {
		return s.b.Pick(ctx, lr)
	}
	return s.pickWhere(ctx, lr, func(key string) bool { return allowed[hostOf(key)] })
}

// pickHealthy returns p if its endpoint is healthy. Otherwise the balancer
// picked it in panic mode, every candidate being unhealthy
// (llmlb.Balancer.SetHealthy): p is finished with errNotCandidate and the
// request picked again among the healthy members whose host allowed holds
// (any, if allowed is nil), which fails with llmlb.ErrNoCandidates, and so
// 503, if there is none. The endpoint picker protocol answers 503 when no
// endpoint is ready (docs/proposals/004-endpoint-picker-protocol), and the
// reference picker never picks a pod that is not ready, which it drops from
// its datastore (pkg/epp/controller/pod_reconciler.go of
// llm-d/llm-d-router v0.10.0): the data plane is not sent to a replica
// known to be down.
func (s *Server) pickHealthy(ctx context.Context, lr *llmlb.Request, p llmlb.Pick, allowed map[string]bool) (llmlb.Pick, error) {
	if e, ok := s.b.StatsOf(p.Endpoint().Key()); !ok || e.Healthy {
		return p, nil // the common case: one lookup, no allocation
	}
	sick := make(map[string]bool)
	for _, e := range s.b.Stats() {
		if !e.Healthy {
			sick[e.Key] = true
		}
	}
	p.Done(errNotCandidate)
	for k := range sick {
		if !slices.Contains(lr.Exclude, k) {
			lr.Exclude = append(lr.Exclude, k)
		}
	}
	p, err := s.pickWhere(ctx, lr, func(k string) bool { return !sick[k] && (allowed == nil || allowed[hostOf(k)]) })
	if errors.Is(err, llmlb.ErrNoCandidates) {
		return p, fmt.Errorf("%w: %w", errNoHealthy, err)
	}
	return p, err
}

// pickWhere picks an endpoint for lr whose key ok accepts: a pick of any
// other (a member that joined after lr.Exclude was made) is finished with
// errNotCandidate, its endpoint excluded, and the request picked again.
// The loop ends: each round excludes one more member.
func (s *Server) pickWhere(ctx context.Context, lr *llmlb.Request, ok func(key string) bool) (llmlb.Pick, error) {
	for {
		p, err := s.b.Pick(ctx, lr)
		if err != nil {
			return p, err
		}
		key := p.Endpoint().Key()
		if ok(key) {
			return p, nil
		}
		p.Done(errNotCandidate)
		lr.Exclude = append(lr.Exclude, key)
	}
}

// admissionKey scopes the session of lr by its tenant, as httplb's
// Transport does, so that one tenant's sessions never count against
// another's.
func admissionKey(lr *llmlb.Request) string {
	if lr.AffinityKey == "" {
		return ""
	}
	return strconv.Itoa(len(lr.Tenant)) + ":" + lr.Tenant + lr.AffinityKey
}

// noteSubset keeps the data plane's subset hint from a request message
// until the request is routed; a hint after it could change nothing.
func (st *stream) noteSubset(m *extprocv3.ProcessingRequest) {
	if st.routed {
		return
	}
	ns := m.GetMetadataContext().GetFilterMetadata()[SubsetNamespace]
	if v, ok := ns.GetFields()[SubsetKey]; ok {
		st.subset = v
	}
}

// subsetExclusions returns the hosts the subset hint allows, and the member
// keys it leaves out, or errEmptySubset if it allows no member. Members match
// an entry by host, as the EPP matches pods by IP address (pkg/epp/requestcontrol/candidates.go
// Locate, in kubernetes-sigs/gateway-api-inference-extension v1.5.0 and
// llm-d/llm-d-router v0.10.0); entries that are not strings are ignored, and
// a hint that is not a list is no hint (nil, nil, nil).
func (st *stream) subsetExclusions() (map[string]bool, []string, error) {
	list := st.subset.GetListValue()
	if list == nil {
		return nil, nil, nil
	}
	allowed := make(map[string]bool, len(list.GetValues()))
	for _, v := range list.GetValues() {
		if s, ok := v.GetKind().(*structpb.Value_StringValue); ok {
			allowed[hostOf(s.StringValue)] = true
		}
	}
	stats := st.s.b.Stats()
	var keys []string
	for _, e := range stats {
		if !allowed[hostOf(e.Key)] {
			keys = append(keys, e.Key)
		}
	}
	if len(keys) == len(stats) {
		return nil, nil, errEmptySubset
	}
	return allowed, keys, nil
}

// hostOf strips the port from an "address:port" endpoint, as the v1.5.0
// EPP does (pkg/epp/requestcontrol/candidates.go), and the brackets of an
// IPv6 address, so that "[fd00::7]:8000", "[fd00::7]" and "fd00::7" are one
// host.
func hostOf(ep string) string {
	if host, _, err := net.SplitHostPort(ep); err == nil {
		return host
	}
	return strings.TrimSuffix(strings.TrimPrefix(ep, "["), "]")
}

// noteServed reads the endpoint the data plane reports as having served the
// request (protocol v1.0.0) and, if it is not the picked one, moves the
// request's accounting to it: the picked endpoint's pick is finished with
// ErrFailedOver and the served one is charged instead.
func (st *stream) noteServed(m *extprocv3.ProcessingRequest) {
	if st.served || !st.picked || st.finished {
		return
	}
	ns := m.GetMetadataContext().GetFilterMetadata()[MetadataNamespace]
	v, ok := ns.GetFields()[ServedKey]
	if !ok {
		return
	}
	st.served = true
	served := v.GetStringValue()
	if served == "" || served == st.primary {
		return
	}
	var exclude []string
	member := false
	for _, e := range st.s.b.Stats() {
		if e.Key == served {
			member = true
			continue
		}
		exclude = append(exclude, e.Key)
	}
	st.pick.Done(ErrFailedOver)
	st.picked = false
	if !member {
		st.s.log.Warn("extproc: the data plane reports an endpoint that is not a member", "request_id", loggable(st.requestID),
			"picked", st.primary, "served", loggable(served))
		return
	}
	lr := st.lr
	lr.Exclude = exclude
	p, err := st.s.pickWhere(st.ctx, &lr, func(key string) bool { return key == served })
	if err != nil {
		return
	}
	if st.first {
		// The response streamed before the data plane said where from.
		p.FirstToken()
		if st.generated > 0 {
			p.Generated(st.generated)
		}
	}
	st.pick, st.picked, st.primary = p, true, served
}

// addHeader adds k: v to h, which it makes if nil, and returns h.
func addHeader(h http.Header, k, v string) http.Header {
	if h == nil {
		h = make(http.Header, 2)
	}
	h[k] = append(h[k], v)
	return h
}

// observeBody calls FirstToken at the end of the first event of a
// successful response (see firstEvent), and reports the output tokens of
// every chunk with Generated.
func (st *stream) observeBody(chunk []byte) {
	if !st.picked || st.finished || len(chunk) == 0 || !st.success() {
		return
	}
	if !st.first && (!st.sse || st.events.Feed(chunk)) {
		st.first = true
		st.pick.FirstToken()
	}
	n := st.output.Count(chunk)
	st.generated += n
	st.pick.Generated(n)
}

// success reports whether the response's status is 2xx, or not known.
func (st *stream) success() bool {
	return st.status == 0 || (st.status >= 200 && st.status <= 299)
}

// complete finishes the pick of a response that ended: successfully for a
// 2xx (or unknown) status, after reporting the output tokens its end
// completes, unless the stream carried an error event (then with
// httplb.ErrErrorEvent), else with a *retry.StatusError.
func (st *stream) complete() {
	if !st.success() {
		st.finish(&retry.StatusError{Code: st.status})
		return
	}
	if st.picked && !st.finished {
		if !st.first && st.sse && st.events.End() {
			// The stream ended in its first event, without the blank
			// line that would have ended it.
			st.first = true
			st.pick.FirstToken()
		}
		st.pick.Generated(st.output.End())
		if st.output.Failed() {
			// The engine failed the request after its 200.
			st.finish(httplb.ErrErrorEvent)
			return
		}
	}
	st.finish(nil)
}

// finish calls the pick's Done and releases the admission, once.
func (st *stream) finish(err error) {
	if st.finished {
		return
	}
	st.finished = true
	if st.picked {
		st.pick.Done(err)
	}
	if st.release != nil {
		st.release()
	}
}

// end finishes the stream's request when Process returns. With the response
// body hidden from the picker (response_body_mode NONE) the response's end is
// the stream's end: Envoy closes a stream by half-closing it and then
// resetting it, so a stream that ends either way after the response headers
// completes the response, and one that ends so before them finishes the
// pick with errResponseUnseen, neither a success nor a failure. Otherwise a
// stream that ends before the response did finishes the pick with
// ErrStreamEnded.
func (st *stream) end(cause error) {
	if st.finished {
		return
	}
	if st.respMode == modeNone && (cause == nil || errors.Is(cause, context.Canceled)) {
		if st.respStarted {
			st.complete()
		} else {
			st.finish(errResponseUnseen)
		}
		return
	}
	switch {
	case cause == nil:
		st.finish(ErrStreamEnded)
	case errors.Is(cause, context.Canceled):
		st.finish(fmt.Errorf("%w: %w", ErrStreamEnded, context.Canceled))
	default:
		st.finish(fmt.Errorf("%w: %w", ErrStreamEnded, cause))
	}
}

// send sends m unless the data plane runs in observability mode, where
// answers are ignored.
func (st *stream) send(m *extprocv3.ProcessingResponse) error {
	if st.observe {
		return nil
	}
	return st.srv.Send(m)
}

// sendChunks streams body back in FULL_DUPLEX_STREAMED mode.
func (st *stream) sendChunks(request bool, body []byte, eos bool) error {
	return st.sendChunksMD(request, body, eos, nil, nil)
}

// sendChunksMD streams body back in pieces of at most maxChunk bytes (the
// v1.5.0 EPP's BodyByteLimit, pkg/common/envoy/chunking.go), end_of_stream
// on the last if eos, md and the header mutation and route cache clearing
// of mut (if not nil) on the first; an empty body is one empty piece.
func (st *stream) sendChunksMD(request bool, body []byte, eos bool, md *structpb.Struct, mut *extprocv3.CommonResponse) error {
	for first := true; first || len(body) > 0; first = false {
		n := min(len(body), maxChunk)
		m := streamedBody(request, body[:n], eos && n == len(body))
		if first {
			m.DynamicMetadata = md
			if mut != nil {
				common := m.GetRequestBody().GetResponse()
				if !request {
					common = m.GetResponseBody().GetResponse()
				}
				common.HeaderMutation, common.ClearRouteCache = mut.HeaderMutation, mut.ClearRouteCache
			}
		}
		if err := st.send(m); err != nil {
			return err
		}
		body = body[n:]
	}
	return nil
}

// budgetRefusal is the refusal of a request whose body, n bytes so far,
// found no room in the Server's budget: 413 if the request could not fit
// even alone, its headers and body over MaxBufferedBytes (possible when
// that is set to the body cap), since waiting would not help; otherwise the
// 429 of a budget full for now.
func (st *stream) budgetRefusal(n int) error {
	if room := st.s.maxBuffered - st.hdrHeld; int64(n) > room {
		return errBodyOverCap(int(max(room, 0)))
	}
	return errBodyBudget
}

// charge adds n bytes to what the stream holds of the Server's body budget,
// and reports whether they fit.
func (st *stream) charge(n int64) bool {
	if !st.s.reserve(n) {
		return false
	}
	st.held += n
	return true
}

// appendBody appends chunk to the body, growing it in steps charged to the
// Server's body budget, and reports whether the budget had room. The body
// grows to twice its size, at least minBodyGrowth and at most the body cap,
// or, when the budget has no room for that, to the size it needs, so that
// what is charged is what is allocated.
func (st *stream) appendBody(chunk []byte) bool {
	need := len(st.body) + len(chunk)
	if need > cap(st.body) {
		size := min(max(need, 2*cap(st.body), minBodyGrowth), st.s.maxBody)
		if !st.charge(int64(size) - st.held) {
			// No room to grow ahead: the size needed, if it fits.
			if size = need; !st.charge(int64(size) - st.held) {
				return false
			}
		}
		grown := make([]byte, len(st.body), size)
		copy(grown, st.body)
		st.body = grown
	}
	st.body = append(st.body, chunk...)
	return true
}

// minBodyGrowth is the least allocation of a body gathered in pieces.
const minBodyGrowth = 4 << 10

// dropScan ends the scan for the response's id, if any, and returns its
// bytes to the Server's budget.
func (st *stream) dropScan() {
	if st.idScan != nil {
		st.idScan.stop()
	}
}

// dropBody lets the body go and returns its bytes to the Server's budget.
func (st *stream) dropBody() {
	st.body = nil
	if st.held != 0 {
		st.s.buffered.Add(-st.held)
		st.held = 0
	}
}

// maxLogged bounds the bytes of a value from the network that are logged.
const maxLogged = 128

// loggable returns a value from the network as it may be logged: at most
// maxLogged bytes, "..." marking a cut, and every byte that is not
// printable ASCII (a control character, a line break, a byte of a
// multi-byte character) replaced by '?', so that a hostile client can
// neither flood the log nor forge its lines.
func loggable(s string) string {
	cut := len(s) > maxLogged
	if cut {
		s = s[:maxLogged]
	}
	plain := true
	for i := 0; i < len(s) && plain; i++ {
		plain = s[i] >= 0x20 && s[i] < 0x7f
	}
	if plain && !cut {
		return s
	}
	b := []byte(s)
	for i, c := range b {
		if c < 0x20 || c >= 0x7f {
			b[i] = '?'
		}
	}
	if cut {
		b = append(b, "..."...)
	}
	return string(b)
}
