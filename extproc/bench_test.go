package extproc_test

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"testing"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/extproc"
	"github.com/llmlb/llmlb/httplb"
	"github.com/llmlb/llmlb/prefix"
)

// benchPromptBytes is the prompt of BenchmarkDecision: 16 KiB of text, as
// in the root package's BenchmarkDecision.
const benchPromptBytes = 16 << 10

// benchSetup is Default over n endpoints whose prefix index holds the first
// half of the benchmark's prompt on 8 of them, and the request body.
func benchSetup(b *testing.B, n int) (*llmlb.Balancer, *httplb.Parser, *prefix.Hasher, string, []byte) {
	r := rand.New(rand.NewPCG(1, 2))
	text := make([]byte, benchPromptBytes)
	for i := range text {
		text[i] = byte('a' + r.IntN(26))
	}
	prompt := string(text)
	h, err := prefix.NewHasher(prefix.HasherConfig{})
	if err != nil {
		b.Fatal(err)
	}
	ix, err := prefix.NewIndex(prefix.IndexConfig{BlockSize: h.BlockTokens()})
	if err != nil {
		b.Fatal(err)
	}
	pol, err := llmlb.Default(llmlb.DefaultConfig{Index: ix})
	if err != nil {
		b.Fatal(err)
	}
	bal := newBalancer(b, n, pol)
	head := h.AppendString(nil, h.Root(prefix.Salt{Model: "m"}), prompt[:benchPromptBytes/2])
	for i := 0; i < 8; i++ {
		if err := ix.Stored(fmt.Sprintf("10.0.0.%d:8000", i*n/8+1), h.BlockTokens(), head...); err != nil {
			b.Fatal(err)
		}
	}
	p, err := httplb.NewParser(httplb.ParserConfig{Hasher: h})
	if err != nil {
		b.Fatal(err)
	}
	body := fmt.Appendf(nil, `{"model":"m","prompt":%q,"max_tokens":256,"stream":true}`, prompt)
	return bal, p, h, prompt, body
}

// BenchmarkDecision measures one routing decision for a 16 KiB prompt at 64
// endpoints under Default, four ways:
//
//   - inprocess=default: hashing the prompt, Pick and Done, as the root
//     package's BenchmarkDecision (the library called in process);
//   - inprocess=parse: the same from the JSON body (httplb.Parser.ParseBody);
//   - extproc=direct: a whole ext_proc stream handled by Server.Process with
//     the messages passed in memory (no gRPC): request headers, the body in
//     FULL_DUPLEX_STREAMED mode, the route and the body streamed back, the
//     response headers and a last response chunk;
//   - extproc=bufconn: the same stream over a gRPC connection in process
//     (google.golang.org/grpc/test/bufconn), client and server in one
//     process, so what Envoy sees minus the network.
func BenchmarkDecision(b *testing.B) {
	const n = 64
	name := func(s string) string { return s + "/endpoints=64/prompt=16KiB" }
	b.Run(name("inprocess=default"), func(b *testing.B) {
		bal, _, h, prompt, _ := benchSetup(b, n)
		root := h.Root(prefix.Salt{Model: "m"})
		dst := make([]uint64, 0, h.MaxBlocks())
		req := &llmlb.Request{PromptTokens: benchPromptBytes / 4, MaxTokens: 256}
		b.ReportAllocs()
		for b.Loop() {
			dst = h.AppendString(dst[:0], root, prompt)
			req.Prefix = dst
			p, err := bal.Pick(context.Background(), req)
			if err != nil {
				b.Fatal(err)
			}
			p.Done(nil)
		}
	})
	b.Run(name("inprocess=parse"), func(b *testing.B) {
		bal, parser, _, _, body := benchSetup(b, n)
		hr, err := http.NewRequest("POST", "http://gw.example/v1/completions", nil)
		if err != nil {
			b.Fatal(err)
		}
		hr.Header.Set("Content-Type", "application/json")
		hr.Header.Set("X-Request-Id", "req-1")
		b.ReportAllocs()
		for b.Loop() {
			lr, err := parser.ParseBody(hr, body)
			if err != nil {
				b.Fatal(err)
			}
			p, err := bal.Pick(context.Background(), &lr)
			if err != nil {
				b.Fatal(err)
			}
			p.Done(nil)
		}
	})
	b.Run(name("extproc=direct"), func(b *testing.B) {
		bal, parser, _, _, body := benchSetup(b, n)
		srv, err := extproc.NewServer(extproc.Config{Balancer: bal, Parser: parser, Logger: quiet})
		if err != nil {
			b.Fatal(err)
		}
		script := benchScript(body)
		d := &directStream{ctx: context.Background()}
		b.ReportAllocs()
		for b.Loop() {
			d.in, d.out = script, d.out[:0]
			if err := srv.Process(d); err != nil {
				b.Fatal(err)
			}
		}
		if len(d.out) != 4 || !idle(bal) {
			b.Fatalf("%d answers, stats %+v", len(d.out), bal.Stats())
		}
	})
	b.Run(name("extproc=bufconn"), func(b *testing.B) {
		bal, parser, _, _, body := benchSetup(b, n)
		h := start(b, extproc.Config{Balancer: bal, Parser: parser})
		script := benchScript(body)
		ctx := context.Background()
		b.ReportAllocs()
		for b.Loop() {
			s, err := h.client.Process(ctx)
			if err != nil {
				b.Fatal(err)
			}
			for i, m := range script {
				if err := s.Send(m); err != nil {
					b.Fatal(err)
				}
				if i == 0 {
					continue // the headers are answered with the body
				}
				for range 1 + boolInt(i == 1) {
					if _, err := s.Recv(); err != nil {
						b.Fatal(err)
					}
				}
			}
			if err := s.CloseSend(); err != nil {
				b.Fatal(err)
			}
			if _, err := s.Recv(); err != io.EOF {
				b.Fatalf("want EOF, got %v", err)
			}
		}
		if !idle(bal) {
			b.Fatalf("stats %+v", bal.Stats())
		}
	})
}

// benchScript is the messages of one request's life in FULL_DUPLEX_STREAMED
// mode.
func benchScript(body []byte) []*extprocv3.ProcessingRequest {
	first := requestHeaders("/v1/completions", false)
	first.ProtocolConfig = &extprocv3.ProtocolConfiguration{RequestBodyMode: fullDuplex, ResponseBodyMode: fullDuplex}
	return []*extprocv3.ProcessingRequest{first, requestBody(body, true),
		responseHeaders(200, "text/event-stream", false), responseBody("data: {}\n\ndata: [DONE]\n\n", true)}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
