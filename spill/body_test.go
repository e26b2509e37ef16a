package spill

import (
	"errors"
	"io"
	"math"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/iotest"
	"time"

	"github.com/llmlb/llmlb/httplb"
)

// A MaxBodyBytes of math.MaxInt64, "no limit" for practical purposes,
// replays the whole body: the read limit of one more byte than the cap
// overflowed, and every request was sent on with an empty body.
func TestMaxBodyBytesHuge(t *testing.T) {
	f := newFixture(t, 1, Config{MaxBodyBytes: math.MaxInt64})
	if code, _, _, err := f.send(`{"prompt":"hi"}`); err != nil || code != 200 {
		t.Fatalf("%d %v", code, err)
	}
	if got := f.tiers[0].bodies; !slices.Equal(got, []string{`{"prompt":"hi"}`}) {
		t.Fatalf("tier got bodies %q, want the request's", got)
	}
}

// A request body that cannot be read fails with an error wrapping
// httplb.ErrBodyRead, which httplb's error handler answers with 400 (408
// for a read timeout) rather than a 502 blaming the upstream.
func TestBodyReadError(t *testing.T) {
	f := newFixture(t, 1, Config{})
	cause := errors.New("malformed chunked encoding")
	r, _ := http.NewRequest("POST", "http://gateway/v1/completions",
		io.MultiReader(strings.NewReader(`{"prompt"`), iotest.ErrReader(cause)))
	_, err := f.tr.RoundTrip(r)
	if !errors.Is(err, httplb.ErrBodyRead) || !errors.Is(err, cause) {
		t.Fatalf("error %v, want one wrapping httplb.ErrBodyRead and the cause", err)
	}
	if f.tiers[0].sent() != 0 {
		t.Fatal("a request whose body could not be read was sent")
	}
}

// stalledBody is an answer's body that sends nothing until it is closed.
type stalledBody struct {
	closed chan struct{}
	once   sync.Once
}

func (b *stalledBody) Read([]byte) (int, error) {
	<-b.closed
	return 0, errors.New("read on closed body")
}

func (b *stalledBody) Close() error {
	b.once.Do(func() { close(b.closed) })
	return nil
}

// A tier that answers 500 and then stops sending its body does not hold
// the request: the answer's body is closed unread and the request goes on
// to the next tier.
func TestSpillPastStalledAnswer(t *testing.T) {
	f := newFixture(t, 2, Config{})
	body := &stalledBody{closed: make(chan struct{})}
	f.tiers[0].set(func(r *http.Request) (*http.Response, error) {
		return &http.Response{StatusCode: http.StatusInternalServerError, Header: http.Header{}, Body: body, Request: r}, nil
	})
	f.tiers[1].set(status(http.StatusOK, "from t1"))
	type result struct {
		code int
		from string
		body string
		err  error
	}
	done := make(chan result, 1)
	go func() {
		code, from, b, err := f.send("{}")
		done <- result{code, from, b, err}
	}()
	select {
	case res := <-done:
		if res.err != nil || res.code != http.StatusOK || res.from != "t0" || res.body != "from t1" {
			t.Fatalf("got %d from %q %q %v, want t1's answer spilled from t0", res.code, res.from, res.body, res.err)
		}
	case <-time.After(10 * time.Second):
		body.Close()
		<-done
		t.Fatal("the request waited on the stalled answer's body")
	}
	select {
	case <-body.closed:
	default:
		t.Error("the stalled answer's body was not closed")
	}
}
