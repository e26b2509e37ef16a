package extproc

import (
	"bytes"
	"encoding/json"
	"hash/maphash"
	"net/http"
	"strings"
	"sync"

	"github.com/hashicorp/golang-lru/v2/simplelru"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/httplb"
	"github.com/llmlb/llmlb/internal/respid"
)

// This file keeps the response affinity of the OpenAI Responses API, as
// package httplb's Transport does: vLLM and SGLang keep a stored response
// in the memory of the process that produced it, so a request continuing
// it ("previous_response_id"), or retrieving, cancelling or deleting it by
// its id, must go back there. The Server remembers which endpoint produced
// each response id it saw in a response, and routes such a request to that
// endpoint only.

// maxResponseIDLen bounds the response ids remembered and looked up, as in
// httplb: a longer id is ignored, as is one a body writes with a JSON
// escape. OpenAI's, vLLM's and SGLang's ids ("resp_" and 32 to 48
// characters) are far shorter.
const maxResponseIDLen = respid.MaxLen

// maxIDScan bounds the bytes of a response body kept to find the response's
// id in: vLLM and SGLang write it in the first event of a stream
// (response.created) and first in a JSON body, well within it.
const maxIDScan = 64 << 10

// responseIDs remembers, for the last [httplb.DefaultMaxResponseIDs]
// response ids, the key of the endpoint that produced each. It keeps seeded
// 64-bit hashes of the ids, not the ids: an id costs the same whatever its
// length, and, the seed being secret, ids cannot be chosen to collide.
type responseIDs struct {
	seed maphash.Seed
	mu   sync.Mutex                     // protects l
	l    *simplelru.LRU[uint64, string] // id hash -> endpoint key
}

func newResponseIDs() *responseIDs {
	l, _ := simplelru.NewLRU[uint64, string](httplb.DefaultMaxResponseIDs, nil) // a positive size never fails
	return &responseIDs{seed: maphash.MakeSeed(), l: l}
}

// learn records that the endpoint key produced the response id.
func (r *responseIDs) learn(id, key string) {
	h := maphash.String(r.seed, id)
	r.mu.Lock()
	r.l.Add(h, key)
	r.mu.Unlock()
}

// lookup returns the key of the endpoint that produced the response id, if
// it is remembered.
func (r *responseIDs) lookup(id string) (string, bool) {
	h := maphash.String(r.seed, id)
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.l.Get(h)
}

// isResponsesCreate reports whether a request creates an OpenAI Responses
// API response: a POST to a path ending in /responses (httplb's rule, on
// the decoded path: see requestURL).
func isResponsesCreate(method, path string) bool {
	return method == http.MethodPost && strings.HasSuffix(path, "/responses")
}

// storedResponseID returns the id of the stored response that a request
// with the given method and decoded path (without its query: see
// requestURL) addresses, by the rules httplb reads it with
// (respid.Stored): an id escaped "%2F" in the raw path is cut at that
// slash, and so is not one.
func storedResponseID(method, path string) (string, bool) { return respid.Stored(method, path) }

// plainResponseID reports whether id may be a response id: 1 to
// maxResponseIDLen bytes, none of them a control character, a space, a
// quote or a backslash.
func plainResponseID(id string) bool {
	if id == "" || len(id) > maxResponseIDLen {
		return false
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; c <= ' ' || c == 0x7f || c == '"' || c == '\\' {
			return false
		}
	}
	return true
}

// previousResponseID returns the top-level "previous_response_id" of the
// JSON object body, if it is a string that may be a response id.
func previousResponseID(body []byte) (string, bool) {
	v, ok := topLevelString(body, "previous_response_id", false)
	if !ok || !plainResponseID(v) {
		return "", false
	}
	return v, true
}

// topLevelString returns the value of the member named key of the JSON
// object that body is, or starts (the members before it complete), if it
// is a string without escapes: of the last such member, as the engines'
// JSON parsers read a request, or, if first is set, of the first, which
// later bytes of a response cut short cannot change.
func topLevelString(body []byte, key string, first bool) (string, bool) {
	i := skipSpace(body, 0)
	if i >= len(body) || body[i] != '{' {
		return "", false
	}
	var val []byte
	for i = skipSpace(body, i+1); i < len(body) && body[i] == '"'; {
		keyEnd := skipString(body, i)
		if keyEnd < 0 {
			break
		}
		name := body[i+1 : keyEnd-1]
		i = skipSpace(body, keyEnd)
		if i >= len(body) || body[i] != ':' {
			break
		}
		i = skipSpace(body, i+1)
		end := skipValue(body, i)
		if end < 0 {
			break
		}
		if string(name) == key {
			val = body[i:end]
			if first {
				break
			}
		}
		if i = skipSpace(body, end); i >= len(body) || body[i] != ',' {
			break
		}
		i = skipSpace(body, i+1)
	}
	if len(val) < 2 || val[0] != '"' || bytes.IndexByte(val, '\\') >= 0 {
		return "", false
	}
	return string(val[1 : len(val)-1]), true
}

// idScan finds the id of a Responses API response in the start of its
// body: in an event stream, the "id" of the "response" of its
// response.created event (the data of one line); in a JSON body, its
// top-level "id". It holds at most maxIDScan bytes, charged to the
// Server's budget for buffered bodies ([Config.MaxBufferedBytes]) as its
// buffer grows, and reads each byte a bounded number of times: the lines
// of a stream once each, a JSON body when its bytes held have doubled
// since the last try, and at its end. When the budget has no room for the
// buffer to grow, the scan gives up: the response goes on, its id
// unlearned. The bytes are returned to the budget when the scan ends
// (found, given up, or at the body's end) or by stop. An id in the body's
// first chunk is read without a copy.
type idScan struct {
	srv   *Server // whose budget the buffer is charged to; nil: none
	sse   bool
	buf   []byte
	held  int64 // the bytes of buf's capacity charged to srv's budget
	off   int   // sse: buf[:off] are complete lines read
	tried int   // json: the bytes held at the last try
	done  bool  // found, or given up
}

// minScanGrowth is the least allocation of an idScan's buffer.
const minScanGrowth = 4 << 10

// feed scans the next chunk of the body, the last if eos, and returns the
// id when found.
func (s *idScan) feed(chunk []byte, eos bool) (string, bool) {
	if s.done {
		return "", false
	}
	if len(s.buf)+len(chunk) >= maxIDScan {
		chunk = chunk[:maxIDScan-len(s.buf)]
		eos = true // the last try
	}
	// The first chunk is read in place, copied (and charged) only if the
	// id is not in it: the common case, the id in the first event or the
	// whole body in one chunk, holds nothing.
	inPlace := len(s.buf) == 0
	if inPlace {
		s.buf = chunk
	} else if !s.keep(chunk) {
		return "", false
	}
	id, ok := s.scan(eos)
	if ok = ok && plainResponseID(id); ok || eos {
		s.stop()
		return id, ok
	}
	if inPlace {
		s.buf = nil
		if !s.keep(chunk) {
			return "", false
		}
	}
	return "", false
}

// keep appends chunk to buf, grown as needed, or, when the budget has no
// room for it, stops the scan (the id goes unlearned) and reports false.
func (s *idScan) keep(chunk []byte) bool {
	if !s.grow(len(chunk)) {
		s.stop()
		return false
	}
	s.buf = append(s.buf, chunk...)
	return true
}

// grow makes room in buf for n more bytes, charging what it allocates to
// the budget, and reports whether the budget had room. The buffer grows to
// twice its size, at least minScanGrowth and at most maxIDScan, so that
// what is charged is what is allocated.
func (s *idScan) grow(n int) bool {
	need := len(s.buf) + n
	if need <= cap(s.buf) {
		return true
	}
	size := min(max(need, 2*cap(s.buf), minScanGrowth), maxIDScan)
	if s.srv != nil && !s.srv.reserve(int64(size)-s.held) {
		return false
	}
	s.held = int64(size)
	grown := make([]byte, len(s.buf), size)
	copy(grown, s.buf)
	s.buf = grown
	return true
}

// stop ends the scan, lets its buffer go and returns its bytes to the
// budget. It may be called any number of times.
func (s *idScan) stop() {
	s.done, s.buf = true, nil
	if s.held != 0 && s.srv != nil {
		s.srv.buffered.Add(-s.held)
	}
	s.held = 0
}

func (s *idScan) scan(eos bool) (string, bool) {
	if s.sse {
		for {
			i := bytes.IndexAny(s.buf[s.off:], "\r\n")
			if i < 0 {
				return "", false
			}
			line := s.buf[s.off : s.off+i]
			s.off += i + 1
			if id, ok := createdID(line); ok {
				return id, true
			}
		}
	}
	if !eos && len(s.buf) < max(2*s.tried, 512) {
		return "", false
	}
	s.tried = len(s.buf)
	return topLevelString(s.buf, "id", true)
}

// createdID returns the response's id if line is the data of a
// response.created event.
func createdID(line []byte) (string, bool) {
	v, ok := bytes.CutPrefix(bytes.TrimPrefix(line, []byte("\uFEFF")), []byte("data:"))
	if !ok || !bytes.Contains(v, []byte(`"response.created"`)) {
		return "", false
	}
	var ev struct {
		Type     string `json:"type"`
		Response struct {
			ID string `json:"id"`
		} `json:"response"`
	}
	if json.Unmarshal(v, &ev) != nil || ev.Type != "response.created" || ev.Response.ID == "" {
		return "", false
	}
	return ev.Response.ID, true
}

// pinTo restricts lr to the member key, and reports whether it could: key
// is a member, whose host allowed holds (any, if allowed is nil), that lr
// does not exclude. Every other member is added to lr.Exclude.
func (s *Server) pinTo(lr *llmlb.Request, key string, allowed map[string]bool) bool {
	if allowed != nil && !allowed[hostOf(key)] {
		return false
	}
	for _, k := range lr.Exclude {
		if k == key {
			return false
		}
	}
	members := s.b.Stats()
	found := false
	ex := lr.Exclude[:len(lr.Exclude):len(lr.Exclude)]
	for _, m := range members {
		if m.Key == key {
			found = true
			continue
		}
		ex = append(ex, m.Key)
	}
	if !found {
		return false
	}
	lr.Exclude = ex
	return true
}
