package extproc_test

import (
	"bytes"
	"context"
	"encoding/json"
	"strconv"
	"testing"
	"unicode/utf8"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/extproc"
	"github.com/llmlb/llmlb/httplb"
	"github.com/llmlb/llmlb/prefix"
)

// FuzzRequestBody sends arbitrary bodies, cut at an arbitrary point, in each
// body mode, through a whole ext_proc exchange, as the body of a chat or a
// Responses request and then as its response's (an event stream or not):
// the Server must route the request or refuse it with an immediate
// response, stream a routed body back unchanged, and leave no accounting
// behind, nor any bytes held of its budget.
func FuzzRequestBody(f *testing.F) {
	for _, seed := range []string{
		`{"model":"m","prompt":"hello","max_tokens":16,"stream":true}`,
		`{"model":"m","messages":[{"role":"user","content":"hi"},{"role":"assistant","content":[{"type":"text","text":"x"}]}]}`,
		`{"prompt":[1,2,3,4],"max_tokens":1e400}`,
		`{"prompt":["a","b"],"user":"\u0000\ud800"}`,
		`{"messages":[`,
		`[]`, `""`, `null`, `{}`, ``,
		string(bytes.Repeat([]byte(`{"a":`), 2000)),
		`{"model":"m","reasoning_effort":"high","thinking":{"type":"enabled","budget_tokens":5000},"messages":[]}`,
		"data: {\"usage\":{\"completion_tokens\":99999999999999999999}}\n\ndata: [DONE]\n",
		`{"usage":{"output_tokens" : 12}}`,
	} {
		for _, mode := range []uint8{0, 1, 2} {
			f.Add([]byte(seed), uint16(len(seed)/2), mode)
		}
	}
	policy, err := llmlb.Default(llmlb.DefaultConfig{})
	if err != nil {
		f.Fatal(err)
	}
	b, err := llmlb.New(policy, llmlb.WithOutputPrediction(llmlb.OutputConfig{MinObservations: 1}))
	if err != nil {
		f.Fatal(err)
	}
	if err := b.Update(addrs(4)); err != nil {
		f.Fatal(err)
	}
	hasher, err := prefix.NewHasher(prefix.HasherConfig{})
	if err != nil {
		f.Fatal(err)
	}
	p, err := httplb.NewParser(httplb.ParserConfig{MaxBodyBytes: 8 << 10, Hasher: hasher})
	if err != nil {
		f.Fatal(err)
	}
	srv, err := extproc.NewServer(extproc.Config{Balancer: b, Parser: p, Fallbacks: 2, Logger: quiet})
	if err != nil {
		f.Fatal(err)
	}
	modes := []filterv3.ProcessingMode_BodySendMode{fullDuplex, buffered, streamed}
	f.Fuzz(func(t *testing.T, body []byte, split uint16, mode uint8) {
		m := modes[int(mode)%len(modes)]
		cut := 0
		if len(body) > 0 {
			cut = int(split) % (len(body) + 1)
		}
		path := "/v1/chat/completions"
		if split&2 == 2 {
			path = "/v1/responses" // the response's id is looked for
		}
		first := requestHeaders(path, false)
		first.ProtocolConfig = &extprocv3.ProtocolConfiguration{RequestBodyMode: m, ResponseBodyMode: m}
		msgs := []*extprocv3.ProcessingRequest{first}
		if m == buffered {
			msgs = append(msgs, requestBody(body, true))
		} else {
			msgs = append(msgs, requestBody(body[:cut], false), requestBody(body[cut:], true))
		}
		ct := "text/event-stream"
		if split&1 == 1 {
			ct = "application/json"
		}
		msgs = append(msgs, responseHeaders(200, ct, false))
		if m == buffered {
			msgs = append(msgs, responseBody(string(body), true))
		} else {
			msgs = append(msgs, responseBody(string(body[:cut]), false), responseBody(string(body[cut:]), true))
		}
		d := &directStream{ctx: context.Background(), in: msgs}
		if err := srv.Process(d); err != nil {
			t.Fatalf("Process: %v", err)
		}
		if !idle(b) || extproc.Buffered(srv) != 0 {
			t.Fatalf("accounting left behind: %+v, %d bytes", b.Stats(), extproc.Buffered(srv))
		}
		if len(d.out) == 0 {
			t.Fatal("no answer")
		}
		if ir := d.out[len(d.out)-1].GetImmediateResponse(); ir != nil {
			if len(body) <= 8<<10 {
				t.Fatalf("refused a body within the cap: %v", ir.GetStatus())
			}
			return
		}
		var dest string
		var back []byte
		for _, a := range d.out {
			for _, c := range []*extprocv3.CommonResponse{a.GetRequestHeaders().GetResponse(), a.GetRequestBody().GetResponse()} {
				for _, h := range c.GetHeaderMutation().GetSetHeaders() {
					if h.GetHeader().GetKey() == extproc.DestinationHeader {
						dest = string(h.GetHeader().GetRawValue())
					}
				}
				back = append(back, c.GetBodyMutation().GetStreamedResponse().GetBody()...)
			}
		}
		if dest == "" {
			t.Fatal("routed without a destination")
		}
		if m == fullDuplex && !bytes.Equal(back, body) {
			t.Fatalf("the body streamed back differs: %d bytes for %d", len(back), len(body))
		}
	})
}

// FuzzModelRewrite sends arbitrary bodies with an arbitrary model rewrite
// header: the Server must route or refuse without failing, hold no body
// afterwards, and, for a JSON object it routes, stream back a JSON object
// whose "model" is the header's value and whose other members are the
// client's, with a Content-Length that matches.
func FuzzModelRewrite(f *testing.F) {
	for _, seed := range []struct{ body, model string }{
		{`{"model":"m","prompt":"hello","max_tokens":16}`, "m2"},
		{`{"prompt":"hello","max_tokens":16}`, `a"b\c`},
		{` { "model" : null , "messages":[{"role":"user","content":"{\"model\":1}"}]} `, "\x00\xff"},
		{`{"model":"m","model":"n","prompt":"x"}`, "é</>"},
		{`{"model":"m"`, "m2"},
		{`{}`, "m2"},
	} {
		f.Add([]byte(seed.body), seed.model)
	}
	b, err := llmlb.New(llmlb.LeastOutstanding())
	if err != nil {
		f.Fatal(err)
	}
	if err := b.Update(addrs(2)); err != nil {
		f.Fatal(err)
	}
	p, err := httplb.NewParser(httplb.ParserConfig{MaxBodyBytes: 8 << 10})
	if err != nil {
		f.Fatal(err)
	}
	srv, err := extproc.NewServer(extproc.Config{Balancer: b, Parser: p, Logger: quiet})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, body []byte, model string) {
		first := requestHeaders("/v1/completions", false, extproc.ModelRewriteHeader, model)
		first.ProtocolConfig = &extprocv3.ProtocolConfiguration{RequestBodyMode: fullDuplex, ResponseBodyMode: fullDuplex}
		d := &directStream{ctx: context.Background(), in: []*extprocv3.ProcessingRequest{first, requestBody(body, true)}}
		if err := srv.Process(d); err != nil {
			t.Fatalf("Process: %v", err)
		}
		if !idle(b) || extproc.Buffered(srv) != 0 {
			t.Fatalf("accounting left behind: %+v, %d bytes", b.Stats(), extproc.Buffered(srv))
		}
		if len(d.out) == 0 || d.out[0].GetImmediateResponse() != nil {
			return
		}
		var back []byte
		var contentLength string
		for _, a := range d.out {
			for _, h := range a.GetRequestHeaders().GetResponse().GetHeaderMutation().GetSetHeaders() {
				if h.GetHeader().GetKey() == "Content-Length" {
					contentLength = string(h.GetHeader().GetRawValue())
				}
			}
			back = append(back, a.GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse().GetBody()...)
		}
		if contentLength != strconv.Itoa(len(back)) {
			t.Fatalf("Content-Length %s for %d bytes", contentLength, len(back))
		}
		var in map[string]json.RawMessage
		if !json.Valid(body) || json.Unmarshal(body, &in) != nil || model == "" || len(model) > 1024 {
			return
		}
		var out map[string]json.RawMessage
		if err := json.Unmarshal(back, &out); err != nil {
			t.Fatalf("the rewritten body is not JSON: %v: %q", err, back)
		}
		var got string
		if err := json.Unmarshal(out["model"], &got); err != nil || utf8.ValidString(model) && got != model {
			t.Fatalf("model %q, want %q", out["model"], model)
		}
		delete(in, "model")
		delete(out, "model")
		if len(in) != len(out) {
			t.Fatalf("members changed: %q -> %q", body, back)
		}
		for k, v := range in {
			if !bytes.Equal(v, out[k]) {
				t.Fatalf("member %q changed: %s -> %s", k, v, out[k])
			}
		}
	})
}
