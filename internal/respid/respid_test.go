package respid_test

import (
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmlb/llmlb/internal/respid"
)

// TestStored: the rules, on decoded paths (url.URL.Path): which requests
// address a stored response, and the id they address.
func TestStored(t *testing.T) {
	long := strings.Repeat("x", respid.MaxLen)
	cases := []struct {
		method, path, want string // want "": none
	}{
		{"GET", "/v1/responses/resp_1", "resp_1"},
		{"GET", "/responses/resp_1", "resp_1"},
		{"GET", "/api/v1/responses/resp_1", "resp_1"},
		{"GET", "/v1/responses/resp_1/input_items", "resp_1"},
		{"GET", "/v1/responses/input_items", "input_items"},
		{"GET", "/v1/responses/" + long, long},
		{"DELETE", "/v1/responses/resp_1", "resp_1"},
		{"POST", "/v1/responses/resp_1/cancel", "resp_1"},
		{"GET", "/v1/responses/résp", "résp"},
		{"GET", "/v1/responses/a+b", "a+b"},
		{"GET", `/v1/responses/"a\b`, `"a\b`},
		{"GET", "/v1/responses/" + long + "x", ""},
		{"GET", "/v1/responses", ""},
		{"GET", "/v1/responses/", ""},
		{"GET", "/v1/responses//input_items", ""},
		{"GET", "/v1/responses/a/b", ""}, // "/v1/responses/a%2Fb" decoded, as the engines decode it
		{"GET", "/v1/responses/resp_1/", ""},
		{"GET", "/v1/responses/resp_1/cancel", ""},
		{"GET", "/v1/responses/.", ""},
		{"GET", "/v1/responses/..", ""},
		{"GET", "/v1/responses/a b", ""},
		{"GET", "/v1/responses/a\x00b", ""},
		{"GET", "/v1/responses/a\nb", ""},
		{"GET", "/v1/responses/a\x7fb", ""},
		{"GET", "/v1/xresponses/resp_1", ""},
		{"GET", "/v1/chat/completions", ""},
		{"GET", "", ""},
		{"POST", "/v1/responses/resp_1", ""},
		{"POST", "/v1/responses/cancel", ""},
		{"POST", "/v1/responses/resp_1/cancel/", ""},
		{"PUT", "/v1/responses/resp_1", ""},
		{"HEAD", "/v1/responses/resp_1", ""},
		{"DELETE", "/v1/responses/resp_1/cancel", ""},
	}
	for _, c := range cases {
		id, ok := respid.Stored(c.method, c.path)
		require.Equal(t, c.want, id, "%s %q", c.method, c.path)
		require.Equal(t, c.want != "", ok, "%s %q", c.method, c.path)
	}
	allocs := testing.AllocsPerRun(100, func() {
		if _, ok := respid.Stored(http.MethodGet, "/v1/responses/resp_1/input_items"); !ok {
			t.Fatal("not a stored response's path")
		}
	})
	require.Zero(t, allocs)
}

// TestStoredEscaped: the rules, on the path that net/http reads from a
// request's target (url.ParseRequestURI's Path, which httplb reads and
// which extproc reads from :path): an escape stands for its byte, "%2F" for
// a slash, which leaves no id or separates one, and a target net/http
// refuses (an invalid escape in the path) addresses no stored response;
// the query is not read.
func TestStoredEscaped(t *testing.T) {
	long := strings.Repeat("x", respid.MaxLen)
	cases := []struct {
		method, target, want string // want "": none
	}{
		{"GET", "/v1/responses/resp_1?stream=true", "resp_1"},
		{"GET", "/v1/responses/resp_1?q=%zz", "resp_1"},
		{"GET", "/v1/responses/resp%5F1", "resp_1"},
		{"GET", "/v1/responses/resp%5f1", "resp_1"},
		{"GET", "/v1/responses/%72%65%73%70_1", "resp_1"},
		{"DELETE", "/v1/responses/resp%5F1", "resp_1"},
		{"POST", "/v1/responses/resp%5F1/cancel", "resp_1"},
		{"GET", "/v1/responses/resp%5F1/input_items", "resp_1"},
		{"GET", "/v1/responses/resp%5F1/input%5Fitems", "resp_1"},
		{"POST", "/v1/responses/resp_1%2Fcancel", "resp_1"},
		{"GET", "/v1/respons%65s/resp_1", "resp_1"},
		{"GET", "/v1/responses%2Fresp_1", "resp_1"},
		{"GET", "/v1/responses/r%C3%A9sp", "résp"},
		{"GET", "/v1/responses/a+b", "a+b"},
		{"GET", "/v1/responses/a%2Bb", "a+b"},
		{"GET", "/v1/responses/%22a%5Cb", `"a\b`},
		{"GET", "/v1/responses/" + strings.Repeat("%78", respid.MaxLen), long},
		{"GET", "/v1/responses/" + strings.Repeat("%78", respid.MaxLen+1), ""},
		{"GET", "/v1/responses/a%2Fb", ""},
		{"GET", "/v1/responses/a%2fb", ""},
		{"GET", "/v1/responses/resp_1%2F", ""},
		{"GET", "/v1/responses/%2E", ""},
		{"GET", "/v1/responses/%2E%2E", ""},
		{"GET", "/v1/responses/a%20b", ""},
		{"GET", "/v1/responses/a%00b", ""},
		{"GET", "/v1/responses/a%0Ab", ""},
		{"GET", "/v1/responses/a%7Fb", ""},
		{"GET", "/v1/responses/resp%", ""},
		{"GET", "/v1/responses/resp%5", ""},
		{"GET", "/v1/responses/resp%zz", ""},
		{"GET", "/v1/responses/resp%5G", ""},
		{"GET", "/v1/x%zz/responses/resp_1", ""},
	}
	for _, c := range cases {
		var id string
		var ok bool
		if u, err := url.ParseRequestURI(c.target); err == nil {
			id, ok = respid.Stored(c.method, u.Path)
		}
		require.Equal(t, c.want, id, "%s %q", c.method, c.target)
		require.Equal(t, c.want != "", ok, "%s %q", c.method, c.target)
	}
}
