package extproc_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/stretchr/testify/require"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/extproc"
)

// TestModelRewrite: the model rewrite header replaces the value of the
// body's "model" before the body goes upstream, every other byte unchanged,
// and Content-Length follows, as llm-d's picker rewrites it.
func TestModelRewrite(t *testing.T) {
	chat := chatBody(200, true)
	cases := []struct {
		name    string
		headers []string
		body    []byte
		want    []byte
	}{
		{"header", []string{extproc.ModelRewriteHeader, "m2"}, chat,
			bytes.Replace(chat, []byte(`"model":"m"`), []byte(`"model":"m2"`), 1)},
		{"old-alias", []string{extproc.OldModelRewriteHeader, "m2"}, chat,
			bytes.Replace(chat, []byte(`"model":"m"`), []byte(`"model":"m2"`), 1)},
		{"new-name-wins", []string{extproc.OldModelRewriteHeader, "old", extproc.ModelRewriteHeader, "m2"}, chat,
			bytes.Replace(chat, []byte(`"model":"m"`), []byte(`"model":"m2"`), 1)},
		{"last-value-wins", []string{extproc.ModelRewriteHeader, "m1", extproc.ModelRewriteHeader, "m2"}, chat,
			bytes.Replace(chat, []byte(`"model":"m"`), []byte(`"model":"m2"`), 1)},
		{"empty-value", []string{extproc.ModelRewriteHeader, "", extproc.OldModelRewriteHeader, "old"}, chat, chat},
		{"same-model", []string{extproc.ModelRewriteHeader, "m"}, chat, chat},
		{"escaped", []string{extproc.ModelRewriteHeader, "a\"b\\c</d>\x01é"},
			[]byte(`{"prompt":"hi", "model" : "m" ,"max_tokens":5}`),
			[]byte(`{"prompt":"hi", "model" : "a\"b\\c</d>\u0001é" ,"max_tokens":5}`)},
		{"no-model", []string{extproc.ModelRewriteHeader, "m2"},
			[]byte(` { "prompt" : "hi", "max_tokens": 5 }`),
			[]byte(` {"model":"m2", "prompt" : "hi", "max_tokens": 5 }`)},
		{"top-level-only", []string{extproc.ModelRewriteHeader, "m2"},
			[]byte(`{"model":"m","metadata":{"model":"x","s":"}\"{"},"prompt":["model","]"],"mo\u0064el":"n","max_tokens":5}`),
			[]byte(`{"model":"m2","metadata":{"model":"x","s":"}\"{"},"prompt":["model","]"],"mo\u0064el":"m2","max_tokens":5}`)},
		{"not-a-string", []string{extproc.ModelRewriteHeader, "m2"},
			[]byte(`{"model":null,"prompt":"hi","max_tokens":5}`),
			[]byte(`{"model":"m2","prompt":"hi","max_tokens":5}`)},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b := newBalancer(t, 2, nil)
			h := start(t, extproc.Config{Balancer: b})
			e := h.open(t, fullDuplex, fullDuplex)
			e.send(requestHeaders("/v1/completions", false, c.headers...))
			e.send(requestBody(c.body[:len(c.body)/2], false))
			e.send(requestBody(c.body[len(c.body)/2:], true))
			m := e.recv()
			hr := m.GetRequestHeaders()
			require.NotNil(t, hr, "want the route, got %v", m)
			require.Equal(t, strconv.Itoa(len(c.want)), routeOf(t, m, hr.GetResponse()).contentLength)
			require.Equal(t, string(c.want), string(streamedBack(t, e.recv(), true).GetBody()))
			var doc map[string]any
			require.NoError(t, json.Unmarshal(c.want, &doc))
			e.cancel()
			waitIdle(t, b)
		})
	}
}

// TestModelRewriteBuffered: in BUFFERED mode the rewritten body is the body
// answer's mutation, with its Content-Length; a BUFFERED_PARTIAL body whose
// rest has not come is not rewritten, since the picker sees only its head.
func TestModelRewriteBuffered(t *testing.T) {
	body := []byte(`{"model":"m","prompt":"hi","max_tokens":5}`)
	want := []byte(`{"model":"long-model-name","prompt":"hi","max_tokens":5}`)
	b := newBalancer(t, 2, nil)
	h := start(t, extproc.Config{Balancer: b})

	e := h.open(t, buffered, buffered)
	e.send(requestHeaders("/v1/completions", false, extproc.ModelRewriteHeader, "long-model-name"))
	require.NotNil(t, e.recv().GetRequestHeaders())
	e.send(requestBody(body, true))
	m := e.recv()
	br := m.GetRequestBody()
	require.NotNil(t, br, "got %v", m)
	r := routeOf(t, m, br.GetResponse())
	require.NotEmpty(t, r.header)
	require.Equal(t, strconv.Itoa(len(want)), r.contentLength)
	require.Equal(t, string(want), string(br.GetResponse().GetBodyMutation().GetBody()))
	e.cancel()

	e = h.open(t, filterv3.ProcessingMode_BUFFERED_PARTIAL, buffered)
	e.send(requestHeaders("/v1/completions", false, extproc.ModelRewriteHeader, "long-model-name"))
	require.NotNil(t, e.recv().GetRequestHeaders())
	e.send(requestBody(body, false))
	m = e.recv()
	require.NotNil(t, m.GetRequestBody(), "got %v", m)
	require.Nil(t, m.GetRequestBody().GetResponse().GetBodyMutation(), "a partial body is not changed")
	require.Empty(t, routeOf(t, m, m.GetRequestBody().GetResponse()).contentLength)
	e.cancel()
	waitIdle(t, b)
}

// TestModelRewriteBadInput: a body that is not a JSON object is answered as
// it is without the header; a rewrite value over the bound, a body with too
// many "model" members, or one the rewrite takes over the body cap, is
// refused; nothing panics and no body stays charged.
func TestModelRewriteBadInput(t *testing.T) {
	b := newBalancer(t, 2, nil)
	srv, err := extproc.NewServer(extproc.Config{Balancer: b, Logger: quiet})
	require.NoError(t, err)
	h := serve(t, srv, b)
	answer := func(body []byte, kv ...string) typev3.StatusCode {
		e := h.open(t, fullDuplex, fullDuplex)
		defer e.cancel()
		e.send(requestHeaders("/v1/completions", false, kv...))
		e.send(requestBody(body, true))
		m := e.recv()
		if ir := m.GetImmediateResponse(); ir != nil {
			return ir.GetStatus().GetCode()
		}
		require.NotNil(t, m.GetRequestHeaders(), "got %v", m)
		return typev3.StatusCode_OK
	}
	for _, body := range []string{`{"model":"m","prompt":`, `{"model":"m",}`, `["model","m"]`, `{"model":"m"}}`,
		`{"model" "m"}`, `{"model":"m`, `{"model":"m","prompt":"hi"} x`, `{"a":[1,{"b":"\"]}`, `{`, ``, `{"model":}`} {
		want := answer([]byte(body))
		require.Equal(t, want, answer([]byte(body), extproc.ModelRewriteHeader, "m2"), "%s", body)
	}
	require.Equal(t, typev3.StatusCode_BadRequest,
		answer(chatBody(100, false), extproc.ModelRewriteHeader, strings.Repeat("m", 1025)))
	require.Equal(t, typev3.StatusCode_OK,
		answer(chatBody(100, false), extproc.ModelRewriteHeader, strings.Repeat("m", 1024)))
	many := `{"prompt":"hi"` + strings.Repeat(`,"model":"m"`, 17) + `}`
	require.Equal(t, typev3.StatusCode_BadRequest, answer([]byte(many), extproc.ModelRewriteHeader, "m2"),
		"too many members to rewrite")
	require.Equal(t, typev3.StatusCode_OK, answer([]byte(many[:len(many)-len(`,"model":"m"}`)]+"}"), extproc.ModelRewriteHeader, "m2"))
	waitIdle(t, b)
	require.Zero(t, extproc.Buffered(srv))

	// A body just under the cap that the rewrite takes over it.
	small, err := extproc.NewServer(extproc.Config{Balancer: b, Parser: parserWithCap(t, 4096), Logger: quiet})
	require.NoError(t, err)
	h = serve(t, small, b)
	body := chatBody(4096-len(chatBody(0, false)), false)
	require.Len(t, body, 4096)
	require.Equal(t, typev3.StatusCode_OK, answer(body))
	require.Equal(t, typev3.StatusCode_PayloadTooLarge, answer(body, extproc.ModelRewriteHeader, "m2"))
	waitIdle(t, b)
	require.Zero(t, extproc.Buffered(small))
}

// recordingPolicy records the requests it chooses for.
type recordingPolicy struct {
	llmlb.Policy
	mu   sync.Mutex
	reqs []llmlb.Request
}

func (p *recordingPolicy) Choose(c *llmlb.Candidates) int {
	p.mu.Lock()
	p.reqs = append(p.reqs, *c.Request())
	p.mu.Unlock()
	return p.Policy.Choose(c)
}

// TestModelRewriteRoutes: the rewritten model is the one the request is
// routed with, its Feature and the salt of its prefix hashes, as llm-d
// schedules on the rewritten TargetModel and salts its prefix hashes with
// it (pkg/epp/framework/plugins/requestcontrol/dataproducer/prefixhash).
func TestModelRewriteRoutes(t *testing.T) {
	pol := &recordingPolicy{Policy: llmlb.LeastOutstanding()}
	b := newBalancer(t, 2, pol)
	h := start(t, extproc.Config{Balancer: b})
	route := func(body []byte, kv ...string) llmlb.Request {
		e := h.open(t, fullDuplex, fullDuplex)
		defer e.cancel()
		e.send(requestHeaders("/v1/chat/completions", false, kv...))
		e.send(requestBody(body, true))
		require.NotNil(t, e.recv().GetRequestHeaders())
		pol.mu.Lock()
		defer pol.mu.Unlock()
		return pol.reqs[len(pol.reqs)-1]
	}
	body := chatBody(2000, false)
	rewritten := route(body, extproc.ModelRewriteHeader, "m2")
	asM2 := route(bytes.Replace(body, []byte(`"model":"m"`), []byte(`"model":"m2"`), 1))
	asM := route(body)
	require.NotEmpty(t, rewritten.Prefix)
	require.Equal(t, asM2.Feature, rewritten.Feature)
	require.Equal(t, asM2.Prefix, rewritten.Prefix)
	require.NotEqual(t, asM.Feature, rewritten.Feature)
	require.False(t, slices.Equal(asM.Prefix, rewritten.Prefix), "the prefix is salted with the rewritten model")
	waitIdle(t, b)
}

// TestModelRewriteResponse: after the request's model was rewritten, the
// response names the model the client asked for, as llm-d's picker renames
// it back (pkg/epp/handlers/server.go rewriteModelName): every "model"
// member with the rewritten name, with or without a space after the colon,
// in a streamed response however it is cut in chunks, whether it ends with
// end_of_stream or with trailers, and in a buffered one with its
// Content-Length. A name that only begins like the rewritten one, a
// compressed body, or a request not rewritten is left as it is.
func TestModelRewriteResponse(t *testing.T) {
	const (
		sent = `data: {"id":"c1","model":"long-model-name","choices":[{"text":"a"}]}` + "\n\n" +
			`data: {"id":"c1","model": "long-model-name","x":{"model":"long-model-name-2"},"choices":[]}` + "\n\n" +
			"data: [DONE]\n\n"
		want = `data: {"id":"c1","model":"m","choices":[{"text":"a"}]}` + "\n\n" +
			`data: {"id":"c1","model": "m","x":{"model":"long-model-name-2"},"choices":[]}` + "\n\n" +
			"data: [DONE]\n\n"
	)
	b := newBalancer(t, 2, nil)
	h := start(t, extproc.Config{Balancer: b})
	request := func(e *envoy, kv ...string) {
		t.Helper()
		e.send(requestHeaders("/v1/completions", false, kv...))
		e.send(requestBody([]byte(`{"model":"m","prompt":"hi","max_tokens":5,"stream":true}`), true))
		require.NotNil(t, e.recv().GetRequestHeaders())
		streamedBack(t, e.recv(), true)
	}
	// respond sends the response in chunks cut at cuts, and returns the
	// body streamed back.
	respond := func(e *envoy, body string, cuts []int, trailers bool, hs ...*corev3.HeaderValue) string {
		t.Helper()
		rh := responseHeaders(200, "text/event-stream", false)
		rh.GetResponseHeaders().GetHeaders().Headers = append(rh.GetResponseHeaders().GetHeaders().Headers, hs...)
		e.send(rh)
		require.NotNil(t, e.recv().GetResponseHeaders())
		var got strings.Builder
		last := 0
		for i, c := range append(cuts, len(body)) {
			eos := i == len(cuts) && !trailers
			e.send(responseBody(body[last:c], eos))
			sr := streamedBack(t, e.recv(), false)
			require.Equal(t, eos, sr.GetEndOfStream())
			got.Write(sr.GetBody())
			last = c
		}
		if trailers {
			e.send(responseTrailers())
			for {
				m := e.recv()
				if m.GetResponseTrailers() != nil {
					break
				}
				got.Write(streamedBack(t, m, false).GetBody())
			}
		}
		require.NoError(t, e.closeAndWait())
		return got.String()
	}
	for cut := 1; cut < len(sent); cut++ {
		for _, trailers := range []bool{false, true} {
			e := h.open(t, fullDuplex, fullDuplex)
			request(e, extproc.ModelRewriteHeader, "long-model-name")
			require.Equal(t, want, respond(e, sent, []int{cut}, trailers), "cut at %d, trailers %v", cut, trailers)
		}
	}
	e := h.open(t, fullDuplex, fullDuplex)
	request(e, extproc.ModelRewriteHeader, "long-model-name")
	require.Equal(t, want, respond(e, sent, []int{1, 2, 3, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 100}, false))

	e = h.open(t, fullDuplex, fullDuplex)
	request(e, extproc.ModelRewriteHeader, "long-model-name")
	require.Equal(t, sent, respond(e, sent, []int{40}, false, header("content-encoding", "identity, gzip")),
		"a compressed body is not read")

	e = h.open(t, fullDuplex, fullDuplex)
	request(e)
	require.Equal(t, sent, respond(e, sent, []int{40}, false), "not rewritten")

	// BUFFERED: the whole body, with its Content-Length.
	e = h.open(t, buffered, buffered)
	e.send(requestHeaders("/v1/completions", false, extproc.ModelRewriteHeader, "long-model-name"))
	require.NotNil(t, e.recv().GetRequestHeaders())
	e.send(requestBody([]byte(`{"model":"m","prompt":"hi","max_tokens":5}`), true))
	require.NotNil(t, e.recv().GetRequestBody())
	rh := responseHeaders(200, "application/json", false)
	rh.GetResponseHeaders().GetHeaders().Headers = append(rh.GetResponseHeaders().GetHeaders().Headers, header("content-length", "60"))
	e.send(rh)
	require.NotNil(t, e.recv().GetResponseHeaders())
	e.send(responseBody(`{"id":"c1","object":"text_completion","model":"long-model-name"}`, true))
	m := e.recv()
	common := m.GetResponseBody().GetResponse()
	require.NotNil(t, common, "got %v", m)
	wantBody := `{"id":"c1","object":"text_completion","model":"m"}`
	require.Equal(t, wantBody, string(common.GetBodyMutation().GetBody()))
	require.Equal(t, strconv.Itoa(len(wantBody)), routeOf(t, m, common).contentLength)
	require.NoError(t, e.closeAndWait())
	waitIdle(t, b)
}

// FuzzRestoreModel: renaming the model back in a body cut in chunks gives
// what renaming it in the whole body gives, and the whole body's rename
// replaces exactly the members `"model":TARGET` and `"model": TARGET`.
func FuzzRestoreModel(f *testing.F) {
	f.Add([]byte(`data: {"model":"mm","x":"model"}`+"\n\n"+`{"model": "mm"}{"model":"mmm"}`), "mm", uint8(5), uint8(17))
	f.Add([]byte(`"model":"model":"m"`), "m", uint8(1), uint8(9))
	f.Add([]byte(`"model":"a\"b"`), `a"b`, uint8(3), uint8(12))
	f.Fuzz(func(t *testing.T, body []byte, target string, c1, c2 uint8) {
		incoming, tgt := []byte(`"client"`), []byte(strconv.Quote(target))
		whole, ok := extproc.RestoreModel(incoming, tgt, [][]byte{body})
		if !ok {
			return
		}
		var want []byte
		for i := 0; i < len(body); {
			rest := body[i:]
			matched := false
			for _, key := range []string{`"model":`, `"model": `} {
				if bytes.HasPrefix(rest, append([]byte(key), tgt...)) {
					want = append(append(want, key...), incoming...)
					i += len(key) + len(tgt)
					matched = true
					break
				}
			}
			if !matched {
				want = append(want, body[i])
				i++
			}
		}
		require.Equal(t, string(want), string(whole))
		a, b := min(int(c1), len(body)), min(int(c1)+int(c2), len(body))
		cut, _ := extproc.RestoreModel(incoming, tgt, [][]byte{body[:a], body[a:b], body[b:]})
		require.Equal(t, string(whole), string(cut))
	})
}

// TestModelRewriteResponsePiecewise: in response body modes STREAMED and
// BUFFERED_PARTIAL, where Envoy replaces each piece it sends with the body
// mutation answered to it (processor_state.cc handleBodyResponse), the
// model is renamed back within each piece, with no Content-Length (Envoy
// removes it in these modes); a member cut across two STREAMED chunks, the
// rest of a BUFFERED_PARTIAL body, a compressed body and a request not
// rewritten are left as they are.
func TestModelRewriteResponsePiecewise(t *testing.T) {
	b := newBalancer(t, 2, nil)
	h := start(t, extproc.Config{Balancer: b})
	request := func(e *envoy, kv ...string) {
		t.Helper()
		e.send(requestHeaders("/v1/completions", false, kv...))
		e.send(requestBody([]byte(`{"model":"m","prompt":"hi","max_tokens":5,"stream":true}`), true))
		require.NotNil(t, e.recv().GetRequestHeaders())
		streamedBack(t, e.recv(), true)
	}
	// respond sends the response body as chunks, and returns what Envoy
	// makes of each: the chunk, or the body mutation answered to it.
	respond := func(e *envoy, chunks []string, eos bool, hs ...*corev3.HeaderValue) []string {
		t.Helper()
		rh := responseHeaders(200, "text/event-stream", false)
		rh.GetResponseHeaders().GetHeaders().Headers = append(rh.GetResponseHeaders().GetHeaders().Headers, hs...)
		e.send(rh)
		require.NotNil(t, e.recv().GetResponseHeaders())
		var out []string
		for i, c := range chunks {
			e.send(responseBody(c, eos && i == len(chunks)-1))
			m := e.recv()
			common := m.GetResponseBody().GetResponse()
			require.NotNil(t, m.GetResponseBody(), "want a body response, got %v", m)
			require.Nil(t, common.GetHeaderMutation(), "no Content-Length in this mode")
			require.Nil(t, common.GetBodyMutation().GetStreamedResponse(), "no streamed response in this mode")
			if mut := common.GetBodyMutation(); mut != nil {
				out = append(out, string(mut.GetBody()))
			} else {
				out = append(out, c)
			}
		}
		if !eos {
			e.send(responseTrailers())
			require.NotNil(t, e.recv().GetResponseTrailers())
		}
		require.NoError(t, e.closeAndWait())
		return out
	}
	const (
		ev1 = `data: {"id":"c1","model":"long-model-name","choices":[{"text":"a"}]}` + "\n\n"
		ev2 = `data: {"id":"c1","model": "long-model-name","x":{"model":"long-model-name-2"},"choices":[]}` + "\n\n"
		ok1 = `data: {"id":"c1","model":"m","choices":[{"text":"a"}]}` + "\n\n"
		ok2 = `data: {"id":"c1","model": "m","x":{"model":"long-model-name-2"},"choices":[]}` + "\n\n"
	)
	cut := strings.Index(ev1, "long-model") + 4
	for _, reqMode := range []filterv3.ProcessingMode_BodySendMode{fullDuplex, buffered} {
		for _, eos := range []bool{true, false} {
			name := fmt.Sprintf("request %v, eos %v", reqMode, eos)
			e := h.open(t, reqMode, streamed)
			if reqMode == buffered {
				e.send(requestHeaders("/v1/completions", false, extproc.ModelRewriteHeader, "long-model-name"))
				require.NotNil(t, e.recv().GetRequestHeaders())
				e.send(requestBody([]byte(`{"model":"m","prompt":"hi","max_tokens":5,"stream":true}`), true))
				require.NotNil(t, e.recv().GetRequestBody())
			} else {
				request(e, extproc.ModelRewriteHeader, "long-model-name")
			}
			got := respond(e, []string{ev1, ev2, ev1[:cut], ev1[cut:], "data: [DONE]\n\n"}, eos)
			require.Equal(t, []string{ok1, ok2, ev1[:cut], ev1[cut:], "data: [DONE]\n\n"}, got, name)
		}
	}

	e := h.open(t, fullDuplex, streamed)
	request(e, extproc.ModelRewriteHeader, "long-model-name")
	require.Equal(t, []string{ev1}, respond(e, []string{ev1}, true, header("content-encoding", "gzip")), "a compressed body is not read")
	e = h.open(t, fullDuplex, streamed)
	request(e)
	require.Equal(t, []string{ev1}, respond(e, []string{ev1}, true), "not rewritten")

	// BUFFERED_PARTIAL: the one piece, the whole body or its start.
	for _, eos := range []bool{true, false} {
		e := h.open(t, fullDuplex, filterv3.ProcessingMode_BUFFERED_PARTIAL)
		request(e, extproc.ModelRewriteHeader, "long-model-name")
		require.Equal(t, []string{ok1 + ok2 + ev1[:cut]}, respond(e, []string{ev1 + ev2 + ev1[:cut]}, eos), "eos %v", eos)
	}
	waitIdle(t, b)
}
