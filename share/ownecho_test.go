package share

import (
	"log/slog"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A Group ignores its own batches, which NATS echoes back to it, from their
// sender alone: the rest is not decoded, so that one whose body is corrupt
// after the sender is neither refused, nor counted, nor logged. Another
// incarnation's batch under the same ID is still decoded, and refused.
func TestOwnBatchIsIgnoredFromItsSender(t *testing.T) {
	var logs lockedBuffer
	clock := &fakeClock{t: at(0)}
	g := offline(t, Config{ID: "a", Clock: clock, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	g.Observer(nil).Pick(pickInfo("e1", 100, 10))
	b := g.AppendBatch(nil)
	head := 1 + 1 + len("a") + 8 // version, id, incarnation
	id, inc, ok := decodeSender(b)
	require.True(t, ok)
	require.Equal(t, "a", string(id))
	require.Equal(t, g.inc, inc)
	part := appendMessage(nil, &message{id: partID("a", 2), inc: g.inc, seq: 9, width: 1, horizon: 1})
	for name, data := range map[string][]byte{
		"truncated":        b[:head],
		"bad body":         append(slices.Clone(b[:head]), 0xff, 0xff),
		"trailing bytes":   append(slices.Clone(b), 0),
		"part, truncated":  part[:1+1+len("a/part2")+8],
		"part, bad ending": append(slices.Clone(part), 1, 2, 3),
	} {
		_, err := decode(data)
		require.ErrorIs(t, err, ErrMalformed, name)
		assert.NoError(t, g.Receive(data), name)
	}
	assert.Zero(t, g.Stats().Rejected)
	assert.Zero(t, g.Stats().Received)
	assert.Zero(t, logs.count("level="))

	other := slices.Clone(b[:head])
	other[head-1] ^= 1 // another incarnation
	assert.ErrorIs(t, g.Receive(append(other, 0xff)), ErrMalformed)
	assert.Equal(t, uint64(1), g.Stats().Rejected)
}
