package spill

import (
	"errors"
	"io"
	"math"
	"net/http"
	"slices"
	"strings"
	"testing"
	"testing/iotest"

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
