package extproc_test

import (
	"strings"
	"sync/atomic"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/extproc"
)

// joinOnChoose is a policy that runs join, once armed, when it is asked to
// choose: an endpoint joins the pool while a request is being decided,
// after its pick took the pool's snapshot (Pick holds no lock while Choose
// runs, so join may update the balancer).
type joinOnChoose struct {
	llmlb.Policy
	armed *atomic.Bool
	join  func()
}

func (j joinOnChoose) Choose(c *llmlb.Candidates) int {
	if j.armed.CompareAndSwap(true, false) {
		j.join()
	}
	return j.Policy.Choose(c)
}

// TestSubsetHintMemberJoins: an endpoint that joins the pool while a
// request with a subset hint is being decided, and that the hint does not
// name, is not listed as a fallback. The protocol
// (docs/proposals/004-endpoint-picker-protocol, "Endpoint Subset") says the
// picker MUST only select endpoints from the list; a pool that scales up
// under load adds endpoints at any moment.
func TestSubsetHintMemberJoins(t *testing.T) {
	const joiner = "10.0.0.9:8000"
	armed := new(atomic.Bool)
	var b *llmlb.Balancer
	b = newBalancer(t, 3, joinOnChoose{Policy: llmlb.LeastOutstanding(), armed: armed, join: func() {
		require.NoError(t, b.Update(append(addrs(3), addr(joiner))))
	}})
	h := start(t, extproc.Config{Balancer: b, Fallbacks: 3})

	armed.Store(true)
	e := h.open(t, fullDuplex, fullDuplex)
	e.md = subsetMetadata("10.0.0.1:8000", "10.0.0.2:8000")
	e.send(requestHeaders("/v1/completions", true))
	m := e.recv()
	r := routeOf(t, m, m.GetRequestHeaders().GetResponse())
	require.False(t, armed.Load(), "the pool grew during the decision")
	require.Equal(t, r.header, r.metadata)
	require.ElementsMatch(t, []string{"10.0.0.1:8000", "10.0.0.2:8000"}, strings.Split(r.header, ","),
		"only the subset's endpoints may be listed")
	require.NoError(t, e.closeAndWait())
	waitIdle(t, b)
}

// TestSubsetHintHostile: malformed, oversized or unknown subset hints get
// the protocol's answers: a hint that is not a list is no hint (as
// llm-d-router's pkg/epp/requestcontrol/candidates.go Locate treats it), and
// a list that names no member, or names members only in entries that are
// not strings, gets 503.
func TestSubsetHintHostile(t *testing.T) {
	many := make([]string, 100000)
	for i := range many {
		many[i] = "192.168.0.1:8000"
	}
	cases := []struct {
		name  string
		hint  []any // nil: the hint's value is a string
		route bool  // the request is routed (else 503)
	}{
		{"string-not-list", nil, true},
		{"unknown-only", []any{"192.168.0.1:8000", "10.0.0.10", "[fd00::1]:8000"}, false},
		{"numbers-only", []any{float64(1), true, nil}, false},
		{"duplicates", []any{"10.0.0.2:8000", "10.0.0.2:8000", "10.0.0.2:9"}, true},
		{"huge-unknown", toAny(many), false},
		{"huge-with-member", append(toAny(many), "10.0.0.2:8000"), true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b := newBalancer(t, 3, nil)
			h := start(t, extproc.Config{Balancer: b, Fallbacks: 2})
			e := h.open(t, fullDuplex, fullDuplex)
			if c.hint == nil {
				e.md = subsetMetadataValue("10.0.0.2:8000")
			} else {
				e.md = subsetMetadataValue(c.hint)
			}
			e.send(requestHeaders("/v1/completions", true))
			m := e.recv()
			if !c.route {
				require.Equal(t, 503, int(m.GetImmediateResponse().GetStatus().GetCode()), "got %v", m)
				require.True(t, idle(b))
				return
			}
			r := routeOf(t, m, m.GetRequestHeaders().GetResponse())
			require.NotEmpty(t, r.header)
			if c.name != "string-not-list" {
				require.Equal(t, "10.0.0.2:8000", r.header)
			} else {
				require.Len(t, strings.Split(r.header, ","), 3, "no hint: the whole pool")
			}
			require.NoError(t, e.closeAndWait())
			waitIdle(t, b)
		})
	}
}

func toAny(s []string) []any {
	out := make([]any, len(s))
	for i, v := range s {
		out[i] = v
	}
	return out
}

// subsetMetadataValue is the metadata_context of a request whose subset
// hint has the value v, whatever its type.
func subsetMetadataValue(v any) *corev3.Metadata {
	s, err := structpb.NewStruct(map[string]any{extproc.SubsetKey: v})
	if err != nil {
		panic(err)
	}
	return &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{extproc.SubsetNamespace: s}}
}

// TestServedHostile: a served-endpoint report that is not a member's
// address, or not a string, never fails the stream nor leaves a request
// charged: a value that is not a string is ignored, and one that names no
// member finishes the pick with ErrFailedOver (the request went elsewhere).
func TestServedHostile(t *testing.T) {
	cases := []struct {
		name     string
		value    any
		failover bool // the pick is finished with ErrFailedOver
	}{
		{"list", []any{"10.0.0.2:8000"}, false},
		{"number", float64(7), false},
		{"struct", map[string]any{"a": "10.0.0.2:8000"}, false},
		{"empty", "", false},
		{"not-a-member", "192.168.0.1:8000", true},
		{"the-whole-list", "10.0.0.1:8000,10.0.0.2:8000", true},
		{"huge", strings.Repeat("9", 1<<20), true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rec := &doneRecorder{}
			b := newBalancer(t, 2, nil, llmlb.WithObserver(rec.observer()))
			h := start(t, extproc.Config{Balancer: b})
			e := h.open(t, fullDuplex, fullDuplex)
			e.send(requestHeaders("/v1/completions", true))
			e.recv()
			s, err := structpb.NewStruct(map[string]any{extproc.ServedKey: c.value})
			require.NoError(t, err)
			e.respMD = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{extproc.MetadataNamespace: s}}
			e.send(responseHeaders(200, "text/event-stream", false))
			require.NotNil(t, e.recv().GetResponseHeaders())
			e.send(responseBody("data: 1\n\n", true))
			require.NotNil(t, e.recv().GetResponseBody())
			require.NoError(t, e.closeAndWait())
			require.True(t, idle(b))
			errs, _ := rec.get()
			require.Len(t, errs, 1)
			if c.failover {
				require.ErrorIs(t, errs[0], extproc.ErrFailedOver)
			} else {
				require.NoError(t, errs[0])
			}
		})
	}
}
