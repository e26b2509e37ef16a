package share

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"
)

// A Group, a Relay and a Follower whose connection is closed for good
// (closed by the program, or out of reconnection attempts) stop and say
// why, instead of waiting for a reconnection that never comes; the
// Follower drops the relayed blocks nothing would correct any more.
func TestRunStopsWhenTheConnectionCloses(t *testing.T) {
	srv := startServer(t, -1)
	sink := &recordingSink{}
	type runner interface{ Run(context.Context) error }
	build := map[string]func(nc *nats.Conn) (runner, error){
		"Group": func(nc *nats.Conn) (runner, error) {
			return New(Config{Conn: nc, Interval: 10 * time.Millisecond, Logger: quiet})
		},
		"Relay": func(nc *nats.Conn) (runner, error) {
			return NewRelay(RelayConfig{Conn: nc, Interval: 10 * time.Millisecond})
		},
		"Follower": func(nc *nats.Conn) (runner, error) {
			return NewFollower(FollowerConfig{Conn: nc, Sink: sink})
		},
	}
	for name, b := range build {
		t.Run(name, func(t *testing.T) {
			nc := connect(t, srv.ClientURL())
			r, err := b(nc)
			require.NoError(t, err)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- r.Run(ctx) }()
			time.Sleep(30 * time.Millisecond) // a few intervals on an open connection
			select {
			case err := <-done:
				t.Fatalf("Run returned %v on an open connection", err)
			default:
			}
			nc.Close()
			select {
			case err := <-done:
				require.ErrorIs(t, err, nats.ErrConnectionClosed)
			case <-time.After(10 * time.Second):
				t.Fatal("Run still running 10 s after its connection closed")
			}
		})
	}
	require.NotEmpty(t, sink.calls)
	require.True(t, sink.calls[len(sink.calls)-1].clear, "the Follower left its relayed blocks: %+v", sink.calls)
}
