package extproc

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/httplb"
	"github.com/llmlb/llmlb/retry"
)

// maxChunk bounds a body piece streamed back to the data plane: the v1.5.0
// EPP's BodyByteLimit (pkg/common/envoy/chunking.go), under the 64 KiB some
// data planes allow.
const maxChunk = 62000

// errEmptySubset: the data plane's subset hint allows no member.
var errEmptySubset = errors.New("extproc: no endpoint in the subset hint")

// errNoHealthy: every endpoint that may take the request is unhealthy. It
// wraps llmlb.ErrNoCandidates, and so is answered 503.
var errNoHealthy = errors.New("extproc: no healthy endpoint")

// errNotCandidate finishes a pick of an endpoint that joined the pool after
// the request's candidates were chosen, and that is not one of them (outside
// the subset hint, or not the endpoint that served the request): the
// request is picked again.
var errNotCandidate = errors.New("extproc: picked an endpoint that is not a candidate")

// errBodyBudget: the request bodies and headers the Server holds leave no
// room for this request's ([Config.MaxBufferedBytes]).
var errBodyBudget = errors.New("extproc: requests in flight are over the server's buffered bytes budget")

// errBodyTimeout: the request was not routed within [Config.BodyTimeout]
// of its first message, its body still coming.
var errBodyTimeout = errors.New("extproc: request body not received in time")

func errBodyOverCap(limit int) error {
	return fmt.Errorf("%w: over %d bytes", httplb.ErrBodyTooLarge, limit)
}

// headersResponse answers request (or response) headers.
func headersResponse(request bool, common *extprocv3.CommonResponse, md *structpb.Struct) *extprocv3.ProcessingResponse {
	if common == nil {
		common = &extprocv3.CommonResponse{}
	}
	hr := &extprocv3.HeadersResponse{Response: common}
	m := &extprocv3.ProcessingResponse{DynamicMetadata: md}
	if request {
		m.Response = &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: hr}
	} else {
		m.Response = &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: hr}
	}
	return m
}

// bodyResponse answers a request (or response) body message in a mode other
// than FULL_DUPLEX_STREAMED.
func bodyResponse(request bool, common *extprocv3.CommonResponse, md *structpb.Struct) *extprocv3.ProcessingResponse {
	if common == nil {
		common = &extprocv3.CommonResponse{}
	}
	br := &extprocv3.BodyResponse{Response: common}
	m := &extprocv3.ProcessingResponse{DynamicMetadata: md}
	if request {
		m.Response = &extprocv3.ProcessingResponse_RequestBody{RequestBody: br}
	} else {
		m.Response = &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: br}
	}
	return m
}

// streamedBody is one piece of a body streamed back in FULL_DUPLEX_STREAMED
// mode.
func streamedBody(request bool, body []byte, eos bool) *extprocv3.ProcessingResponse {
	return bodyResponse(request, &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{
		Mutation: &extprocv3.BodyMutation_StreamedResponse{StreamedResponse: &extprocv3.StreamedBodyResponse{Body: body, EndOfStream: eos}},
	}}, nil)
}

// trailersResponse answers request (or response) trailers.
func trailersResponse(request bool) *extprocv3.ProcessingResponse {
	if request {
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestTrailers{RequestTrailers: &extprocv3.TrailersResponse{}}}
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseTrailers{ResponseTrailers: &extprocv3.TrailersResponse{}}}
}

// routeMutation sets the destination header (replacing any the client sent)
// and, if contentLength >= 0, Content-Length, and clears the route cache so
// that the data plane routes on the new header, as the v1.5.0 EPP does
// (pkg/epp/handlers/request.go generateRequestHeaderResponse).
func routeMutation(dest string, contentLength int) *extprocv3.CommonResponse {
	set := []*corev3.HeaderValueOption{setHeader(DestinationHeader, dest)}
	if contentLength >= 0 {
		set = append(set, setHeader("Content-Length", strconv.Itoa(contentLength)))
	}
	return &extprocv3.CommonResponse{HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: set}, ClearRouteCache: true}
}

// stripDestination removes the destination header a client may have sent,
// for a headers answer that sets no route: the data plane must never route
// on a value the client chose.
func stripDestination() *extprocv3.CommonResponse {
	return &extprocv3.CommonResponse{HeaderMutation: &extprocv3.HeaderMutation{RemoveHeaders: []string{DestinationHeader}}}
}

func setHeader(k, v string) *corev3.HeaderValueOption {
	return &corev3.HeaderValueOption{
		Header:       &corev3.HeaderValue{Key: k, RawValue: []byte(v)},
		AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
	}
}

// destinationMetadata is the dynamic metadata carrying dest: the same value
// as the header, which the protocol requires.
func destinationMetadata(dest string) *structpb.Struct {
	return &structpb.Struct{Fields: map[string]*structpb.Value{
		MetadataNamespace: structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
			DestinationHeader: structpb.NewStringValue(dest),
		}}),
	}}
}

// refusal is how a failure is answered.
type refusal struct {
	code       typev3.StatusCode
	kind       string // the OpenAI error type
	message    string // what the client reads
	details    string // the data plane's response code details, for its access log
	retryAfter time.Duration
	dropped    string // the DroppedReasonHeader value; "" for none
}

// classify maps a failure to its answer: the protocol's 503 when no
// endpoint may take the request and 429 for requests shed under load
// (docs/proposals/004-endpoint-picker-protocol), each with llm-d's
// [DroppedReasonHeader], and the statuses httplb's error handler gives the
// other failures.
func classify(err error) refusal {
	var overload *retry.OverloadError
	switch {
	case errors.As(err, &overload):
		return refusal{typev3.StatusCode_TooManyRequests, "rate_limit_error", "Too many requests in flight; retry later.",
			"llmlb_overloaded", max(overload.RetryAfter, time.Second), droppedSaturated}
	case errors.Is(err, retry.ErrOverloaded):
		return refusal{typev3.StatusCode_TooManyRequests, "rate_limit_error", "Too many requests in flight; retry later.",
			"llmlb_overloaded", retry.DefaultAdmissionRetryAfter, droppedSaturated}
	case errors.Is(err, errBodyBudget):
		return refusal{typev3.StatusCode_TooManyRequests, "rate_limit_error", "Too many requests in flight; retry later.",
			"llmlb_body_budget", time.Second, droppedSaturated}
	case errors.Is(err, llmlb.ErrNoEndpoints), errors.Is(err, llmlb.ErrNoCandidates), errors.Is(err, errEmptySubset), errors.Is(err, errNoHealthy):
		return refusal{typev3.StatusCode_ServiceUnavailable, "service_unavailable", "No model server is available.",
			"llmlb_no_endpoint", 0, droppedNoEndpoints}
	case errors.Is(err, errBodyTimeout):
		// As Envoy's request_timeout and httplb's proxy answer a body
		// not received in time.
		return refusal{typev3.StatusCode_RequestTimeout, "invalid_request_error", "The request body was not received in time.",
			"llmlb_body_timeout", 0, ""}
	case errors.Is(err, httplb.ErrBodyTooLarge):
		return refusal{typev3.StatusCode_PayloadTooLarge, "invalid_request_error", "The request body is too large.",
			"llmlb_body_too_large", 0, ""}
	case errors.Is(err, httplb.ErrUnauthenticated):
		return refusal{typev3.StatusCode_Unauthorized, "authentication_error", "The request could not be authenticated.",
			"llmlb_unauthenticated", 0, ""}
	case errors.Is(err, llmlb.ErrInvalidRequest):
		return refusal{typev3.StatusCode_BadRequest, "invalid_request_error", "The request is invalid.",
			"llmlb_invalid_request", 0, ""}
	}
	return refusal{typev3.StatusCode_InternalServerError, "server_error", "The request could not be routed.",
		"llmlb_internal_error", 0, ""}
}

// refuse answers the request with an immediate response for err, and logs
// err, which the client never sees.
func (st *stream) refuse(err error) error {
	rf := classify(err)
	attrs := []any{"request_id", loggable(st.requestID), "status", int(rf.code), "error", err}
	if rf.code == typev3.StatusCode_InternalServerError {
		st.s.log.Error("extproc: request not routed", attrs...)
	} else {
		st.s.log.Info("extproc: request refused", attrs...)
	}
	return st.send(immediateResponse(rf, st.requestID))
}

// immediateResponse is rf as an OpenAI-style JSON error, with the request's
// id (Envoy's x-request-id) in the message and in a header.
func immediateResponse(rf refusal, requestID string) *extprocv3.ProcessingResponse {
	msg := rf.message
	if requestID != "" && plainID(requestID) {
		msg += " Request ID: " + requestID
	} else {
		requestID = ""
	}
	var b strings.Builder
	b.WriteString(`{"error":{"message":`)
	b.WriteString(strconv.Quote(msg))
	b.WriteString(`,"type":"`)
	b.WriteString(rf.kind)
	b.WriteString(`","code":`)
	b.WriteString(strconv.Itoa(int(rf.code)))
	b.WriteString("}}\n")
	set := []*corev3.HeaderValueOption{setHeader("content-type", "application/json")}
	if rf.retryAfter > 0 {
		secs := int64(math.Ceil(rf.retryAfter.Seconds())) // no overflow near the largest Duration
		set = append(set, setHeader("retry-after", strconv.FormatInt(secs, 10)))
	}
	if requestID != "" {
		set = append(set, setHeader("x-request-id", requestID))
	}
	if rf.dropped != "" {
		set = append(set, setHeader(DroppedReasonHeader, rf.dropped))
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{
		ImmediateResponse: &extprocv3.ImmediateResponse{
			Status:  &typev3.HttpStatus{Code: rf.code},
			Headers: &extprocv3.HeaderMutation{SetHeaders: set},
			Body:    []byte(b.String()),
			Details: rf.details,
		},
	}}
}

// plainID reports whether id is short and plain enough to echo: at most 128
// letters, digits, '-', '_', '.' or ':' (httplb's rule).
func plainID(id string) bool {
	if len(id) > 128 {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_' || c == '.' || c == ':') {
			return false
		}
	}
	return true
}
