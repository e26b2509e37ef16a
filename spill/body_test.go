package spill

import (
	"errors"
	"fmt"
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

// stallAfter is an answer's body that sends head, then nothing until it is
// closed.
type stallAfter struct {
	head string
	stalledBody
}

func (b *stallAfter) Read(p []byte) (int, error) {
	if b.head != "" {
		n := copy(p, b.head)
		b.head = b.head[n:]
		return n, nil
	}
	return b.stalledBody.Read(p)
}

// A 400 or 422 whose body stalls after its headers does not hold the
// request while DefaultSpill waits to tell a context-length error: after
// maxPeekTime it is taken as none, and the answer stays with its tier,
// whose body reaches the caller whole when it comes, the bytes read ahead
// and the rest. A body that says it is a context-length error and then
// stalls spills, after maxPeekTime, and is closed.
func TestContextLengthStalledBody(t *testing.T) {
	refusal := `{"error":{"code":"context_length_exceeded","message":"This model's maximum context length is 8192 tokens"}}`
	// roundTrip sends a request through f, failing after the guard and
	// calling unblock to end the wait.
	roundTrip := func(t *testing.T, f *fixture, unblock func()) (*http.Response, error) {
		t.Helper()
		type result struct {
			resp *http.Response
			err  error
		}
		done := make(chan result, 1)
		go func() {
			r, _ := http.NewRequest("POST", "http://gateway/v1/chat/completions", strings.NewReader("{}"))
			resp, err := f.tr.RoundTrip(r)
			done <- result{resp, err}
		}()
		select {
		case res := <-done:
			return res.resp, res.err
		case <-time.After(10 * maxPeekTime):
			unblock()
			if res := <-done; res.resp != nil {
				res.resp.Body.Close()
			}
			t.Fatal("the request waited on the stalled answer's body")
			return nil, nil
		}
	}

	t.Run("stays", func(t *testing.T) {
		f := newFixture(t, 2, Config{})
		pr, pw := io.Pipe()
		defer pr.Close()
		f.tiers[0].set(func(r *http.Request) (*http.Response, error) {
			return &http.Response{StatusCode: http.StatusBadRequest, Header: http.Header{}, Body: pr, Request: r}, nil
		})
		// A refusal, padded past what is read ahead, that arrives too late
		// to be told as one.
		body := refusal + strings.Repeat(" ", 2*maxPeekBytes)
		send := func() {
			go func() {
				_, _ = io.WriteString(pw, body[:10])
				_, _ = io.WriteString(pw, body[10:])
				_ = pw.Close()
			}()
		}
		resp, err := roundTrip(t, f, send)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || resp.Header.Get(DefaultHeader) != "" || f.tiers[1].sent() != 0 {
			t.Fatalf("got %d from %q, %d sent to the next tier; want the first tier's 400",
				resp.StatusCode, resp.Header.Get(DefaultHeader), f.tiers[1].sent())
		}
		if ev := f.takeEvents(); len(ev) != 0 {
			t.Fatalf("events %v, want none", ev)
		}
		send()
		got, err := io.ReadAll(resp.Body)
		if err != nil || string(got) != body {
			t.Fatalf("read %d bytes, %v; want the whole body of %d", len(got), err, len(body))
		}
	})

	t.Run("spills", func(t *testing.T) {
		f := newFixture(t, 2, Config{})
		body := &stallAfter{head: refusal, stalledBody: stalledBody{closed: make(chan struct{})}}
		defer body.Close()
		f.tiers[0].set(func(r *http.Request) (*http.Response, error) {
			return &http.Response{StatusCode: http.StatusBadRequest, Header: http.Header{}, Body: body, Request: r}, nil
		})
		f.tiers[1].set(status(http.StatusOK, "from t1"))
		resp, err := roundTrip(t, f, func() { body.Close() })
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK || resp.Header.Get(DefaultHeader) != "t0" {
			t.Fatalf("got %d from %q, want t1's answer spilled from t0", resp.StatusCode, resp.Header.Get(DefaultHeader))
		}
		if ev, want := f.takeEvents(), []Event{{From: "t0", To: "t1", Reason: ContextLength}}; !slices.Equal(ev, want) {
			t.Fatalf("events %v, want %v", ev, want)
		}
		select {
		case <-body.closed:
		default:
			t.Error("the stalled answer's body was not closed")
		}
	})
}

// onceErrBody sends head, then fails once with err, then reports EOF, as
// a body that does not repeat its error does.
type onceErrBody struct {
	head string
	err  error
}

func (b *onceErrBody) Read(p []byte) (int, error) {
	if b.head != "" {
		n := copy(p, b.head)
		b.head = b.head[n:]
		return n, nil
	}
	if err := b.err; err != nil {
		b.err = nil
		return 0, err
	}
	return 0, io.EOF
}

func (b *onceErrBody) Close() error { return nil }

// A 400 whose body fails while it is read to tell a context-length error
// stays, and its reader gets the bytes that came and then the failure, not
// an end that would pass a cut body for a whole one.
func TestContextLengthBodyFails(t *testing.T) {
	errBroken := errors.New("connection reset")
	resp := &http.Response{StatusCode: http.StatusBadRequest, Header: http.Header{},
		Body: &onceErrBody{head: `{"error":{"message":"bad tem`, err: errBroken}}
	if reason, spill := DefaultSpill(resp, nil); spill {
		t.Fatalf("spilled as %q", reason)
	}
	got, err := io.ReadAll(resp.Body)
	if string(got) != `{"error":{"message":"bad tem` || !errors.Is(err, errBroken) {
		t.Fatalf("read %q, %v; want the bytes sent and %v", got, err, errBroken)
	}
	if _, err := resp.Body.Read(make([]byte, 1)); !errors.Is(err, errBroken) {
		t.Fatalf("read again: %v, want %v", err, errBroken)
	}
}

// emptyReads is a body whose every read returns nothing and no error.
type emptyReads struct{}

func (emptyReads) Read([]byte) (int, error) { return 0, nil }
func (emptyReads) Close() error             { return nil }

// A 400 whose body never makes progress, each read returning nothing
// without an error, is no context-length error and costs no endless loop:
// it stays, and reading it fails with io.ErrNoProgress, as a bufio.Reader
// over it would.
func TestContextLengthBodyNoProgress(t *testing.T) {
	done := make(chan error, 1)
	go func() {
		resp := &http.Response{StatusCode: http.StatusBadRequest, Header: http.Header{}, Body: emptyReads{}}
		if reason, spill := DefaultSpill(resp, nil); spill {
			done <- fmt.Errorf("spilled as %q", reason)
			return
		}
		_, err := io.ReadAll(resp.Body)
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, io.ErrNoProgress) {
			t.Fatalf("read: %v, want %v", err, io.ErrNoProgress)
		}
	case <-time.After(10 * maxPeekTime):
		t.Fatal("reading a body that makes no progress did not end") // and spins on
	}
}
