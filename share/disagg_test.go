package share

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmlb/llmlb"
)

// A Group observing the decode pool of a Disaggregated pair leaves no load
// behind in what its peers see once the requests have ended, whether they
// completed or failed before their prefill ended: it follows the requests
// prefilled on the prefill pool as the decode balancer counts them,
// streaming from the pick on.
func TestDisaggregatedDecodePoolLeavesNoLoad(t *testing.T) {
	clock := &fakeClock{t: at(0)}
	a := offline(t, Config{ID: "a", Clock: clock})
	b := offline(t, Config{ID: "b", Clock: clock})
	pre, err := llmlb.New(llmlb.RoundRobin(), llmlb.WithClock(clock))
	require.NoError(t, err)
	dec, err := llmlb.New(llmlb.RoundRobin(), llmlb.WithClock(clock), llmlb.WithObserver(a.Observer(nil)))
	require.NoError(t, err)
	require.NoError(t, pre.Update([]llmlb.Endpoint{key("p0")}))
	require.NoError(t, dec.Update([]llmlb.Endpoint{key("d0")}))
	d, err := llmlb.NewDisaggregated(pre, dec, llmlb.DisaggConfig{})
	require.NoError(t, err)
	for i := range 6 {
		pk, err := d.Pick(context.Background(), &llmlb.Request{PromptTokens: 1000, OutputTokens: 10})
		require.NoError(t, err)
		require.False(t, pk.Local(), "request %d prefilled on its decode endpoint", i)
		clock.Advance(10 * time.Millisecond)
		if i%2 == 0 {
			pk.Prefilled()
			pk.FirstToken()
			clock.Advance(10 * time.Millisecond)
			pk.Done(nil)
		} else {
			pk.Done(context.DeadlineExceeded) // failed before its prefill ended
		}
	}
	transfer(a, b)
	if l, ok := b.Load("d0"); ok {
		require.Zero(t, l.Running, "%+v", l)
		require.Zero(t, l.Waiting, "%+v", l)
		require.Zero(t, l.PeerWaiting, "%+v", l)
		require.Zero(t, l.PeerPrefillTokens, "%+v", l)
	}
}
