package httplb

import (
	"bytes"
	"hash/maphash"
	"net/http"
	"slices"
	"strings"
	"sync"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/internal/lru"
	"github.com/llmlb/llmlb/internal/respid"
)

// This file keeps the response affinity of the OpenAI Responses API: vLLM
// and SGLang keep a stored response in the memory of the process that
// produced it, so a request continuing it (with "previous_response_id")
// must go back there. The Transport remembers which endpoint produced each
// response id it saw, and sends a request continuing one of them to that
// endpoint only.

// DefaultMaxResponseIDs is the number of response ids a Transport remembers
// for response affinity when [Config.MaxResponseIDs] is 0.
const DefaultMaxResponseIDs = 1 << 16

// maxResponseIDLen bounds the response ids remembered and looked up: a
// longer id, or one with an escape, is ignored. OpenAI's, vLLM's and
// SGLang's ids ("resp_" and 32 to 48 characters) are far shorter.
const maxResponseIDLen = respid.MaxLen

// responseIDs remembers, for each response id, the endpoint that produced
// it. It keeps seeded 64-bit hashes of both, not the strings: each id costs
// the same few dozen bytes whatever its length, and learning one allocates
// nothing once the list is full. Two ids with the same hash are one id to
// it: with 2^16 ids held, an id it never saw is taken for a known one with
// a probability under 2^-47, and the seed is secret, so that ids cannot be
// chosen to collide.
type responseIDs struct {
	seed maphash.Seed
	mu   sync.Mutex // protects l
	l    *lru.LRU   // id hash -> endpoint key hash
}

func newResponseIDs(n int) *responseIDs {
	return &responseIDs{seed: maphash.MakeSeed(), l: lru.New(n, nil)}
}

// learn records that the endpoint key produced the response id.
func (r *responseIDs) learn(id []byte, key string) {
	h, k := maphash.Bytes(r.seed, id), int64(maphash.String(r.seed, key))
	r.mu.Lock()
	r.l.Add(h, k)
	r.mu.Unlock()
}

// learnString is learn for an id held in a string.
func (r *responseIDs) learnString(id, key string) {
	h, k := maphash.String(r.seed, id), int64(maphash.String(r.seed, key))
	r.mu.Lock()
	r.l.Add(h, k)
	r.mu.Unlock()
}

// lookup returns the hash of the key of the endpoint that produced the
// response id, if it is remembered.
func (r *responseIDs) lookup(id []byte) (key uint64, ok bool) {
	h := maphash.Bytes(r.seed, id)
	r.mu.Lock()
	k, ok := r.l.Get(h)
	r.mu.Unlock()
	return uint64(k), ok
}

// lookupString is lookup for an id held in a string: maphash.String hashes
// a string as maphash.Bytes hashes its bytes.
func (r *responseIDs) lookupString(id string) (key uint64, ok bool) {
	h := maphash.String(r.seed, id)
	r.mu.Lock()
	k, ok := r.l.Get(h)
	r.mu.Unlock()
	return uint64(k), ok
}

// len returns the number of ids remembered.
func (r *responseIDs) len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.l.Len()
}

// isResponses reports whether req creates an OpenAI Responses API response:
// a POST to a path ending in /responses.
func isResponses(req *http.Request) bool {
	return req.Method == http.MethodPost && strings.HasSuffix(req.URL.Path, "/responses")
}

// storedResponseID returns the id of the stored response that a request
// with the given method and decoded path addresses (see respid.Stored).
func storedResponseID(method, path string) (string, bool) { return respid.Stored(method, path) }

// pin restricts lr to the endpoint that produced the response that the
// request continues, whose id is prev, and reports whether it did: when the
// id is remembered and its endpoint is a member that lr does not exclude,
// every other member is added to lr.Exclude. Otherwise lr is left to be
// routed as any other request.
func (t *Transport) pin(lr *llmlb.Request, prev []byte) bool {
	want, ok := t.ids.lookup(prev)
	if !ok {
		return false
	}
	return t.pinTo(lr, want)
}

// pinString is pin for an id held in a string, such as a path segment.
func (t *Transport) pinString(lr *llmlb.Request, id string) bool {
	want, ok := t.ids.lookupString(id)
	if !ok {
		return false
	}
	return t.pinTo(lr, want)
}

// pinTo restricts lr to the member whose key hashes to want, as pin does.
func (t *Transport) pinTo(lr *llmlb.Request, want uint64) bool {
	members := t.b.Stats()
	at := -1
	for i, s := range members {
		if maphash.String(t.ids.seed, s.Key) == want {
			at = i
			break
		}
	}
	if at < 0 || slices.Contains(lr.Exclude, members[at].Key) {
		return false // gone, or refused by Config.Adjust
	}
	ex := make([]string, len(lr.Exclude), len(lr.Exclude)+len(members)-1)
	copy(ex, lr.Exclude)
	for i, s := range members {
		if i != at {
			ex = append(ex, s.Key)
		}
	}
	lr.Exclude = ex
	return true
}

// responseID returns the raw JSON string v without its quotes if it is a
// response id this package remembers: a complete string of 1 to
// maxResponseIDLen bytes without escapes; else nil.
func responseID(v []byte) []byte {
	if len(v) < 3 || v[0] != '"' || v[len(v)-1] != '"' {
		return nil
	}
	s := v[1 : len(v)-1]
	if len(s) > maxResponseIDLen || bytes.IndexByte(s, '\\') >= 0 {
		return nil
	}
	return s
}

// heldResponseID returns the id of the response whose first bytes are
// held, the bytes held back from a 2xx answer to a Responses request
// before its commitment: for an event stream, the response's "id" in its
// response.created event; for a JSON body, its top-level "id", if held
// whole (vLLM writes it first). It returns nil if there is none
// it can read there, and it does not allocate.
func heldResponseID(held []byte, stream bool) []byte {
	if stream {
		return streamResponseID(held)
	}
	return jsonResponseID(held)
}

// jsonResponseID returns the top-level "id" of the JSON object that held
// starts, if the member and the separator after it are among the bytes
// held; the members before it must be too.
func jsonResponseID(held []byte) []byte {
	b := skipSpace(held)
	if len(b) == 0 || b[0] != '{' {
		return nil
	}
	var buf [maxKeyLen]byte
	l := list{rest: b[1:]}
	for {
		k, v, ok := l.member()
		if !ok || !isString(k) {
			return nil
		}
		after := skipSpace(l.rest)
		if len(after) == 0 || after[0] != ',' && after[0] != '}' {
			return nil // cut off, or not JSON
		}
		if string(keyName(k, &buf)) == "id" {
			return responseID(v)
		}
		if after[0] == '}' {
			return nil
		}
	}
}

// streamResponseID returns the response's "id" in the response.created
// event among the complete lines of held, the start of an event stream.
func streamResponseID(held []byte) []byte {
	for {
		i := bytes.IndexAny(held, "\r\n")
		if i < 0 {
			return nil // no more complete lines
		}
		line := bytes.TrimPrefix(held[:i], []byte("\uFEFF"))
		held = held[i+1:]
		v, ok := bytes.CutPrefix(line, []byte("data:"))
		if !ok || !bytes.Contains(v, []byte(`"`+createdType+`"`)) {
			continue
		}
		if id := createdID(v); id != nil {
			return id
		}
	}
}

// createdID returns the response's id in v, the data of an event, if it is
// a response.created event: a JSON object whose "type" is
// "response.created", with a "response" object whose "id" is a response id
// (see responseID).
func createdID(v []byte) []byte {
	var vd validator
	start := skipSpaceAt(v, 0)
	end, ok := vd.value(v, start, 0)
	if !ok || skipSpaceAt(v, end) != len(v) {
		return nil
	}
	var buf [maxKeyLen]byte
	var typ, resp []byte
	l, ok := listOf(v[start:end], '{')
	if !ok {
		return nil
	}
	for k, mv, ok := l.member(); ok; k, mv, ok = l.member() {
		switch string(keyName(k, &buf)) {
		case typeKey:
			typ = mv
		case "response":
			resp = mv
		}
	}
	if string(typ) != `"`+createdType+`"` {
		return nil
	}
	var id []byte
	rl, ok := listOf(resp, '{')
	if !ok {
		return nil
	}
	for k, mv, ok := rl.member(); ok; k, mv, ok = rl.member() {
		if string(keyName(k, &buf)) == "id" {
			id = mv
		}
	}
	return responseID(id)
}
