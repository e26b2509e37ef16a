package share

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// lockedSink records the calls of a running Follower.
type lockedSink struct {
	mu    sync.Mutex
	calls []sinkCall
}

func (s *lockedSink) Apply(key string, seq int64, payload []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls = append(s.calls, sinkCall{key: key, seq: seq, payload: string(payload)})
}

func (s *lockedSink) Clear() {}

func (s *lockedSink) snapshot() []sinkCall {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]sinkCall(nil), s.calls...)
}

// Endpoint keys reach the Followers through a real NATS server exactly as
// the Relay was given them, whatever nats.go does to header values: it
// trims their spaces and tabs and turns line breaks into spaces, so that
// " e1", "e1 " and "e1" would all arrive as "e1", and another endpoint's
// blocks would be indexed under it.
func TestRelayKeysRoundTripExactly(t *testing.T) {
	keys := []string{
		" e1", "e1 ", "\te1", "e1\t", "e1\r\n", "e1\nx", "e1\rx",
		"e1", "", " ", "e 1", "é1", "e1:x", "\x00e1", strings.Repeat(" ", maxKeyBytes),
	}
	ns := startServer(t, -1)
	sink := &lockedSink{}
	f, err := NewFollower(FollowerConfig{Conn: connect(t, ns.ClientURL()), Sink: sink})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx) }()
	defer func() { cancel(); <-done }()
	nc := connect(t, ns.ClientURL())
	r, err := NewRelay(RelayConfig{Conn: nc, ID: "r1"})
	require.NoError(t, err)
	// The Follower subscribes in Run: relay a first batch until it
	// arrives.
	require.Eventually(t, func() bool {
		r.Forward("ready", 0, []byte("batch"))
		_ = nc.Flush()
		return len(sink.snapshot()) > 0
	}, 10*time.Second, 10*time.Millisecond)
	var got []sinkCall
	relayedKeys := func() []sinkCall {
		got = got[:0]
		for _, c := range sink.snapshot() {
			if c.key != "ready" {
				got = append(got, c)
			}
		}
		return got
	}
	for i, k := range keys {
		r.Forward(k, int64(i), []byte("batch"))
	}
	require.NoError(t, nc.Flush())
	_, failed := r.Published()
	require.Zero(t, failed)
	require.Eventually(t, func() bool { return len(relayedKeys()) == len(keys) }, 10*time.Second, time.Millisecond)
	for i, c := range got {
		assert.Equal(t, sinkCall{key: keys[i], seq: int64(i), payload: "batch"}, c, "key %q", keys[i])
	}
}

// A message whose endpoint key is of an unknown encoding, or not valid
// base64, names no known endpoint: the Follower reports it and applies
// nothing, rather than take its text for a key.
func TestFollowerRefusesUndecodableKeys(t *testing.T) {
	sink := &recordingSink{}
	var errs []error
	f, err := NewFollower(FollowerConfig{Conn: new(nats.Conn), Sink: sink, OnError: func(_ string, err error) { errs = append(errs, err) }})
	require.NoError(t, err)
	unknown := relayed(" e1", 1, []byte("b"))
	unknown.Header.Set(headerEndpointEncoding, "rot13")
	f.receive(unknown)
	bad := relayed(" e1", 1, []byte("b"))
	bad.Header.Set(headerEndpoint, "!!")
	f.receive(bad)
	long := relayed(" e1", 1, []byte("b"))
	long.Header.Set(headerEndpoint, strings.Repeat("AAAA", maxKeyBytes))
	f.receive(long)
	assert.Empty(t, sink.calls)
	require.Len(t, errs, 3)
	for _, err := range errs {
		assert.ErrorIs(t, err, ErrMalformed)
	}
	f.receive(relayed(" e1", 1, []byte("b")))
	assert.Equal(t, []sinkCall{{key: " e1", seq: 1, payload: "b"}}, sink.calls)
}

// Messages naming many Relay IDs, each with endpoints of its own, make a
// Follower follow at most maxStreams endpoints of maxStreamRelays Relays,
// and maxRelays Relays: else one publisher could make it hold 1024 Relays
// of thousands of keys of a kilobyte. The batches beyond are handed on.
func TestFollowerBoundsFollowedKeys(t *testing.T) {
	sink := &fuzzSink{}
	f, err := NewFollower(FollowerConfig{Conn: new(nats.Conn), Sink: sink})
	require.NoError(t, err)
	pad := strings.Repeat("k", 100)
	sent := 0
	for r := range 2 * maxRelays {
		id := fmt.Sprintf("r%d", r)
		for k := range 2 * maxStreams / maxRelays {
			f.receive(relayMessage(DefaultRelaySubject, id, fmt.Sprintf("%s-%d-%s", id, k, pad), 1, []byte("b"), 1<<20))
			sent++
		}
		f.receive(relayMessage(DefaultRelaySubject, id, "shared", int64(r+1), []byte(id), 1<<20))
		sent++
	}
	assert.Equal(t, maxStreams, len(f.streams))
	assert.Equal(t, maxRelays, len(f.relays))
	for _, s := range f.streams {
		assert.LessOrEqual(t, len(s.from), maxStreamRelays)
	}
	assert.Equal(t, sent, len(sink.keys), "every batch handed on once: no two alike")
}
