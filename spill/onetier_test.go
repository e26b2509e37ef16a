package spill

import (
	"net/http"
	"testing"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/httplb"
	"github.com/llmlb/llmlb/retry"
)

// oneEndpointTier returns an httplb transport that sends every request to
// url over base, once: a tier of one endpoint behind round robin, without
// retries.
func oneEndpointTier(t *testing.T, url string, base http.RoundTripper) http.RoundTripper {
	t.Helper()
	b, err := llmlb.New(llmlb.RoundRobin())
	if err != nil {
		t.Fatal(err)
	}
	eps, err := httplb.NewEndpoints(url)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Update(eps); err != nil {
		t.Fatal(err)
	}
	tr, err := httplb.NewTransport(httplb.Config{Balancer: b, Base: base, Retry: retry.LoopConfig{MaxAttempts: 1}})
	if err != nil {
		t.Fatal(err)
	}
	return tr
}
