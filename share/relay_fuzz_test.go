package share

import (
	"bytes"
	"encoding/base64"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

// fuzzSink records the calls of a Follower, payloads as given.
type fuzzSink struct {
	keys     []string
	seqs     []int64
	payloads [][]byte
}

func (s *fuzzSink) Apply(key string, seq int64, payload []byte) {
	s.keys, s.seqs, s.payloads = append(s.keys, key), append(s.seqs, seq), append(s.payloads, payload)
}
func (s *fuzzSink) Clear() {}

// FuzzFollowerReceive hands a Follower relayed messages with fuzzed headers
// and data: it never panics, hands the Sink exactly one call per message,
// with the endpoint the message names (none for a key longer than a Relay
// sends, or of an unknown or malformed encoding), and passes the data on
// only with the
// non-negative sequence number the message carries; anything else is a
// clear.
func FuzzFollowerReceive(f *testing.F) {
	f.Add("e1", "", "7", []byte("batch"))
	f.Add("e1", "", "clear", []byte(nil))
	f.Add("", "", "-3", []byte("x"))
	f.Add("e2", "", "99999999999999999999", []byte{})
	f.Add(strings.Repeat("k", maxKeyBytes+1), "", "1", []byte("x"))
	f.Add("IGUx", endpointBase64, "1", []byte("x"))
	f.Add("IGUx=", endpointBase64, "1", []byte("x"))
	f.Add("e1", "gzip", "1", []byte("x"))
	f.Fuzz(func(t *testing.T, key, enc, seq string, data []byte) {
		sink := &fuzzSink{}
		fl, err := NewFollower(FollowerConfig{Conn: new(nats.Conn), Sink: sink})
		if err != nil {
			t.Fatal(err)
		}
		m := nats.NewMsg(DefaultRelaySubject)
		m.Header.Set(headerEndpoint, key)
		if enc != "" {
			m.Header.Set(headerEndpointEncoding, enc)
		}
		m.Header.Set(headerSeq, seq)
		m.Data = data
		fl.receive(m)
		want, ok := key, enc == ""
		if enc == endpointBase64 {
			b, err := base64.StdEncoding.Strict().DecodeString(key)
			want, ok = string(b), err == nil
		}
		if !ok || len(want) > maxKeyBytes {
			if len(sink.keys) != 0 {
				t.Fatalf("%d calls for a message naming key %q in encoding %q", len(sink.keys), key, enc)
			}
			return
		}
		if len(sink.keys) != 1 {
			t.Fatalf("%d calls for one message", len(sink.keys))
		}
		if sink.keys[0] != want {
			t.Fatalf("key %q, message names %q", sink.keys[0], want)
		}
		got, p := sink.seqs[0], sink.payloads[0]
		if p == nil {
			if got != -1 {
				t.Fatalf("a clear with sequence %d", got)
			}
			return
		}
		if n, err := strconv.ParseInt(m.Header.Get(headerSeq), 10, 64); err != nil || n != got || got < 0 {
			t.Fatalf("sequence %d passed on for header %q", got, m.Header.Get(headerSeq))
		}
		if !bytes.Equal(p, data) {
			t.Fatalf("payload %q for data %q", p, data)
		}
	})
}

// dupSink fails the fuzz test when a key is handed the same batch twice in
// a row.
type dupSink struct {
	t    *testing.T
	last map[string]string
}

func (s *dupSink) Apply(key string, seq int64, payload []byte) {
	if payload == nil {
		delete(s.last, key)
		return
	}
	b := strconv.FormatInt(seq, 10) + "/" + string(payload)
	if s.last[key] == b {
		s.t.Fatalf("batch %s of %q handed on twice", b, key)
	}
	s.last[key] = b
}
func (s *dupSink) Clear() {}

// FuzzFollowerStreams hands a Follower the messages of a few Relays, each
// byte choosing a Relay, an endpoint, a sequence number, a payload, a clear
// or a heartbeat, a message number and a step of the clock: it never
// panics, keeps within its bounds, and never hands the Sink a batch twice
// in a row.
func FuzzFollowerStreams(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9})
	f.Add(bytes.Repeat([]byte{0x11, 0x91, 0x12, 0x92}, 8))
	f.Fuzz(func(t *testing.T, ops []byte) {
		clock := &fakeClock{t: time.Unix(1000, 0)}
		sink := &dupSink{t: t, last: map[string]string{}}
		fl, err := NewFollower(FollowerConfig{Conn: new(nats.Conn), Sink: sink, Clock: clock})
		if err != nil {
			t.Fatal(err)
		}
		msgs := map[string]uint64{}
		for i := 0; i+1 < len(ops); i += 2 {
			a, b := ops[i], ops[i+1]
			id := "r" + strconv.Itoa(int(a&7))
			key := "e" + strconv.Itoa(int(a>>3&3))
			var m *nats.Msg
			switch b >> 6 {
			case 0:
				m = relayMessage(DefaultRelaySubject, id, key, -1, nil, 1<<20)
			case 1:
				m = (&Relay{subject: DefaultRelaySubject, id: id, interval: time.Second}).heartbeat()
			default:
				seq := int64(b & 15)
				m = relayMessage(DefaultRelaySubject, id, key, seq, []byte{byte(seq), b >> 4 & 3}, 1<<20)
			}
			if a>>5 != 0 {
				msgs[id] += uint64(a >> 5)
				m.Header.Set(headerRelayMsg, "i-"+strconv.FormatUint(msgs[id], 10))
			}
			clock.Advance(time.Duration(b>>4&3) * time.Second)
			fl.receive(m)
			if b&0x30 == 0x30 {
				fl.expire()
			}
			if len(fl.streams) > maxStreams || len(fl.relays) > maxRelays {
				t.Fatalf("%d streams, %d relays", len(fl.streams), len(fl.relays))
			}
			for _, s := range fl.streams {
				if len(s.from) > maxStreamRelays || len(s.from) == 0 {
					t.Fatalf("a stream of %d relays", len(s.from))
				}
			}
		}
	})
}
