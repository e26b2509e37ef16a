package share

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// An endpoint key too long for the wire is not shared, and the batch
// carrying the others still is: one long key must not make every peer
// refuse every batch.
func TestLongEndpointKeyDoesNotBlockSharing(t *testing.T) {
	clock := &fakeClock{t: at(0)}
	a := offline(t, Config{ID: "a", Clock: clock})
	b := offline(t, Config{ID: "b", Clock: clock, Signal: &signalMap{}})
	long := strings.Repeat("k", maxKeyBytes+1)
	a.Observer(nil).Pick(pickInfo(long, 100, 10))
	a.Observer(nil).Pick(pickInfo("e1", 100, 10))
	assert.Equal(t, uint64(1), a.Stats().Dropped, "the pick at the long key")
	clock.Set(at(50))
	require.NoError(t, b.Receive(a.AppendBatch(nil)))
	l, ok := b.Load("e1")
	require.True(t, ok)
	assert.Equal(t, 1, l.Waiting)
}

// Two replicas configured with the same ID each hide the other's work from
// their peers: the Group says so in its log, once per other replica, not
// only in Stats.Rejected.
func TestDuplicateIDIsLogged(t *testing.T) {
	var logs lockedBuffer
	clock := &fakeClock{t: at(0)}
	a1 := offline(t, Config{ID: "a", Clock: clock})
	a2 := offline(t, Config{ID: "a", Clock: clock, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	for range 3 {
		clock.Advance(DefaultInterval)
		assert.ErrorIs(t, a2.Receive(a1.AppendBatch(nil)), ErrRefused)
	}
	assert.Equal(t, 1, logs.count("level=WARN"), "one warning")
	assert.Equal(t, 1, logs.count("another replica publishes under this ID"))
}

// Batches under this Group's ID with ever new incarnations (a replica in a
// crash loop, or a hostile publisher) are refused, and logged at most once
// a minute rather than once each.
func TestDuplicateIDLogIsBounded(t *testing.T) {
	var logs lockedBuffer
	clock := &fakeClock{t: at(0)}
	a := offline(t, Config{ID: "a", Clock: clock, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	for i := range uint64(100) {
		clock.Advance(time.Second)
		b := appendMessage(nil, &message{id: "a", inc: a.inc + 1 + i, seq: 1, width: 1, horizon: 1})
		assert.ErrorIs(t, a.Receive(b), ErrRefused)
	}
	assert.Equal(t, 2, logs.count("another replica publishes under this ID"), "at 1s and 61s")
	assert.Equal(t, uint64(100), a.Stats().Rejected)
}
