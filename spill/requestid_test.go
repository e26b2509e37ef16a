package spill

import (
	"net/http"
	"slices"
	"strings"
	"testing"
)

// Each tier a request is sent to gets an X-Request-Id of its own, the
// first tier the request's own and every later one the request's with the
// tier's name appended, so that tiers over the same engines never send two
// requests with one id (vLLM takes the header for its request id and
// refuses one it is running). httplb's retries of each append "-n".
func TestRequestIDPerTier(t *testing.T) {
	var ids [3][]string
	var tiers []Tier
	for i, name := range []string{"ptu", "paygo", "has space"} {
		tiers = append(tiers, Tier{Name: name, Transport: roundTripperFunc(func(r *http.Request) (*http.Response, error) {
			ids[i] = append(ids[i], r.Header.Get("X-Request-Id"))
			return status(503, "")(r)
		})})
	}
	tr, err := New(Config{Tiers: tiers})
	if err != nil {
		t.Fatal(err)
	}
	send := func(id string) {
		t.Helper()
		r, _ := http.NewRequest("POST", "http://gateway/v1/completions", strings.NewReader("{}"))
		if id != "" {
			r.Header.Set("X-Request-Id", id)
		}
		resp, err := tr.RoundTrip(r)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if got := r.Header.Get("X-Request-Id"); got != id {
			t.Fatalf("the caller's request was changed: X-Request-Id %q, want %q", got, id)
		}
	}
	send("req_abc")
	send("")       // no id: none is made up
	send("bad id") // not an id httplb would use: left alone
	long := "req_" + strings.Repeat("x", 123)
	send(long) // no room for a suffix within 128 characters: left alone
	want := [3][]string{
		{"req_abc", "", "bad id", long},
		{"req_abc.paygo", "", "bad id", long},
		{"req_abc.2", "", "bad id", long}, // a name that is not a token: the tier's index
	}
	for i := range want {
		if !slices.Equal(ids[i], want[i]) {
			t.Errorf("tier %d sent ids %q, want %q", i, ids[i], want[i])
		}
	}
}

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
