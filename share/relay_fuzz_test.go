package share

import (
	"bytes"
	"encoding/base64"
	"strconv"
	"strings"
	"testing"

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
