package httplb

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/llmlb/llmlb"
	"github.com/stretchr/testify/require"
)

// roundTripFunc answers every request in memory, so the benchmark measures
// the transport, not the network.
type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func BenchmarkRoundTrip(b *testing.B) {
	const stream = "data: {\"i\":0}\n\ndata: [DONE]\n\n"
	base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		_, _ = io.Copy(io.Discard, r.Body)
		return &http.Response{
			StatusCode: http.StatusOK,
			Header:     http.Header{"Content-Type": {"text/event-stream"}},
			Body:       io.NopCloser(strings.NewReader(stream)),
			Request:    r,
		}, nil
	})
	for _, name := range []string{"least-outstanding", "default"} {
		b.Run("policy="+name, func(b *testing.B) {
			policy := llmlb.LeastOutstanding()
			if name == "default" {
				var err error
				policy, err = llmlb.Default(llmlb.DefaultConfig{})
				require.NoError(b, err)
			}
			bal, err := llmlb.New(policy)
			require.NoError(b, err)
			eps, err := NewEndpoints("http://a:1", "http://b:1", "http://c:1", "http://d:1")
			require.NoError(b, err)
			require.NoError(b, bal.Update(eps))
			tr, err := NewTransport(Config{Balancer: bal, Base: base})
			require.NoError(b, err)
			b.ReportAllocs()
			for b.Loop() {
				req, _ := http.NewRequest(http.MethodPost, "http://gw/v1/chat/completions", strings.NewReader(chatBody))
				resp, err := tr.RoundTrip(req)
				if err != nil {
					b.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
	}
}
