package share

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// An endpoint another Relay relays too (the first one restarted under a
// new ID, or replaced) keeps its blocks when the first one's heartbeats
// are missed: only the endpoints no other Relay carries are dropped, and
// those of the new Relay are dropped when it falls silent in turn.
func TestFollowerKeepsEndpointsTakenOver(t *testing.T) {
	clock := &fakeClock{t: at(0)}
	sink := &recordingSink{}
	f, err := NewFollower(FollowerConfig{Conn: new(nats.Conn), Sink: sink, Clock: clock})
	require.NoError(t, err)
	from := func(id string, m *nats.Msg) *nats.Msg { m.Header.Set(headerRelay, id); return m }
	old := &Relay{subject: DefaultRelaySubject, id: "relay-old", interval: 100 * time.Millisecond}
	f.receive(old.heartbeat())
	f.receive(from(old.id, relayed("e1", 1, []byte("b1"))))
	f.receive(from(old.id, relayed("e2", 1, []byte("b2"))))

	// The old Relay dies; the new one relays e1 before the old one's
	// heartbeats are missed: a repeat, then the next batch.
	clock.Set(at(100))
	renewed := &Relay{subject: DefaultRelaySubject, id: "relay-new", interval: 100 * time.Millisecond}
	f.receive(renewed.heartbeat())
	f.receive(from(renewed.id, relayed("e1", 1, []byte("b1"))))
	f.receive(from(renewed.id, relayed("e1", 2, []byte("b3"))))
	require.Equal(t, []sinkCall{{key: "e1", seq: 2, payload: "b3"}}, sink.calls[2:], "the repeat is not handed on")
	clock.Set(at(301))
	f.expire()
	assert.Equal(t, []sinkCall{{key: "e2", seq: -1}}, sink.calls[3:], "the old Relay's silence drops only the endpoint no other Relay carries")

	// The new Relay goes on; then it falls silent too.
	f.receive(renewed.heartbeat())
	clock.Set(at(700))
	f.expire()
	assert.Equal(t, []sinkCall{{key: "e1", seq: -1}}, sink.calls[4:], "the new Relay's silence drops its endpoint")
}
