package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/llmlb/llmlb/extproc"
)

// dataPlane is a minimal stand-in for Envoy's HTTP data path with the
// ext_proc filter configured as the inference extension's manifests
// configure it (request and response bodies FULL_DUPLEX_STREAMED, trailers
// SEND, failure mode FailClose): for each request it opens an ext_proc
// stream to the picker, sends the headers and the body in pieces, takes the
// first endpoint of x-gateway-destination-endpoint from the headers answer
// (checking that the envoy.lb metadata agrees), forwards the body streamed
// back to it, and passes the response through the stream, piece by piece,
// reporting the endpoint that served it in the envoy.lb metadata. An
// immediate response is written as it is. A client that goes away cancels
// the ext_proc stream, as Envoy resets it.
type dataPlane struct {
	epp      extprocv3.ExternalProcessorClient
	upstream *http.Client
	chunk    int // request body piece size
}

func (d *dataPlane) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	s, err := d.epp.Process(ctx)
	if err != nil {
		http.Error(w, "ext_proc unavailable", http.StatusInternalServerError)
		return
	}
	fail := func(err error) { http.Error(w, "ext_proc: "+err.Error(), http.StatusInternalServerError) }

	hs := []*corev3.HeaderValue{hv(":method", r.Method), hv(":path", r.URL.RequestURI()), hv(":authority", r.Host), hv(":scheme", "http")}
	for k, vs := range r.Header {
		for _, v := range vs {
			hs = append(hs, hv(strings.ToLower(k), v))
		}
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return
	}
	err = s.Send(&extprocv3.ProcessingRequest{
		ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, ResponseBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED},
		Request:        &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{Headers: hs}, EndOfStream: len(body) == 0}},
	})
	if err != nil {
		fail(err)
		return
	}
	for i := 0; i < len(body); i += d.chunk {
		end := min(i+d.chunk, len(body))
		if err := s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
			RequestBody: &extprocv3.HttpBody{Body: body[i:end], EndOfStream: end == len(body)}}}); err != nil {
			fail(err)
			return
		}
	}

	m, err := s.Recv()
	if err != nil {
		fail(err)
		return
	}
	if ir := m.GetImmediateResponse(); ir != nil {
		for _, h := range ir.GetHeaders().GetSetHeaders() {
			w.Header().Set(h.GetHeader().GetKey(), string(h.GetHeader().GetRawValue()))
		}
		w.WriteHeader(int(ir.GetStatus().GetCode()))
		_, _ = w.Write(ir.GetBody())
		return
	}
	common := m.GetRequestHeaders().GetResponse()
	var dest string
	for _, h := range common.GetHeaderMutation().GetSetHeaders() {
		if h.GetHeader().GetKey() == extproc.DestinationHeader {
			dest = string(h.GetHeader().GetRawValue())
		}
	}
	md := m.GetDynamicMetadata().GetFields()[extproc.MetadataNamespace].GetStructValue().GetFields()[extproc.DestinationHeader].GetStringValue()
	if dest == "" || dest != md || !common.GetClearRouteCache() {
		fail(fmt.Errorf("bad route: header %q, metadata %q", dest, md))
		return
	}
	var upBody []byte
	if len(body) > 0 {
		for {
			m, err := s.Recv()
			if err != nil {
				fail(err)
				return
			}
			sr := m.GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse()
			upBody = append(upBody, sr.GetBody()...)
			if sr.GetEndOfStream() {
				break
			}
		}
	}
	target := strings.Split(dest, ",")[0] // the first valid endpoint of the list

	up, err := http.NewRequestWithContext(ctx, r.Method, "http://"+target+r.URL.RequestURI(), bytes.NewReader(upBody))
	if err != nil {
		fail(err)
		return
	}
	up.Header = r.Header.Clone()
	resp, err := d.upstream.Do(up)
	if err != nil {
		http.Error(w, "upstream connect error", http.StatusServiceUnavailable)
		return
	}
	defer resp.Body.Close()
	served := servedMD(target)
	rh := []*corev3.HeaderValue{hv(":status", strconv.Itoa(resp.StatusCode))}
	for k, vs := range resp.Header {
		for _, v := range vs {
			rh = append(rh, hv(strings.ToLower(k), v))
		}
	}
	if err := s.Send(&extprocv3.ProcessingRequest{MetadataContext: served, Request: &extprocv3.ProcessingRequest_ResponseHeaders{
		ResponseHeaders: &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{Headers: rh}}}}); err != nil {
		fail(err)
		return
	}
	if m, err := s.Recv(); err != nil || m.GetResponseHeaders() == nil {
		fail(fmt.Errorf("no response headers answer: %v", err))
		return
	}
	for k, vs := range resp.Header {
		w.Header()[k] = vs
	}
	w.WriteHeader(resp.StatusCode)
	flusher, _ := w.(http.Flusher)
	buf := make([]byte, 4096)
	for {
		n, rerr := resp.Body.Read(buf)
		eos := rerr != nil
		if n == 0 && !eos {
			continue
		}
		if err := s.Send(&extprocv3.ProcessingRequest{MetadataContext: served, Request: &extprocv3.ProcessingRequest_ResponseBody{
			ResponseBody: &extprocv3.HttpBody{Body: bytes.Clone(buf[:n]), EndOfStream: eos}}}); err != nil {
			return
		}
		m, err := s.Recv()
		if err != nil {
			return
		}
		if _, err := w.Write(m.GetResponseBody().GetResponse().GetBodyMutation().GetStreamedResponse().GetBody()); err != nil {
			return
		}
		if flusher != nil {
			flusher.Flush()
		}
		if eos {
			break
		}
	}
	_ = s.CloseSend()
	for {
		if _, err := s.Recv(); err != nil {
			return
		}
	}
}

func hv(k, v string) *corev3.HeaderValue { return &corev3.HeaderValue{Key: k, RawValue: []byte(v)} }

func servedMD(ep string) *corev3.Metadata {
	s, _ := structpb.NewStruct(map[string]any{extproc.ServedKey: ep})
	return &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{extproc.MetadataNamespace: s}}
}
