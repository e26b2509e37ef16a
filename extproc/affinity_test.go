package extproc_test

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmlb/llmlb/extproc"
)

// TestResponseAffinity: a Responses API request that continues a stored
// response ("previous_response_id"), or retrieves, cancels or deletes one
// by its id, goes to the endpoint that produced it, whose id the picker
// read in the response (the response.created event of a stream, however
// cut, or the "id" of a JSON body), even when the policy would choose
// another; an id it never saw, or one in a response to another kind of
// request, is routed as any request.
func TestResponseAffinity(t *testing.T) {
	b := newBalancer(t, 3, nil) // least outstanding
	h := start(t, extproc.Config{Balancer: b})

	// route sends a request and returns the endpoint it is routed to,
	// leaving its stream open (the endpoint stays busy) until the test
	// ends.
	route := func(method, path, body string) (*envoy, string) {
		t.Helper()
		e := h.open(t, fullDuplex, fullDuplex)
		hs := requestHeaders(path, body == "")
		for _, hv := range hs.GetRequestHeaders().GetHeaders().GetHeaders() {
			if hv.GetKey() == ":method" {
				hv.RawValue = []byte(method)
			}
		}
		e.send(hs)
		if body != "" {
			e.send(requestBody([]byte(body), true))
		}
		m := e.recv()
		hr := m.GetRequestHeaders()
		require.NotNil(t, hr, "got %v", m)
		if body != "" {
			streamedBack(t, e.recv(), true)
		}
		return e, routeOf(t, m, hr.GetResponse()).header
	}
	respond := func(e *envoy, contentType string, chunks ...string) {
		t.Helper()
		e.send(responseHeaders(200, contentType, false))
		require.NotNil(t, e.recv().GetResponseHeaders())
		for i, c := range chunks {
			e.send(responseBody(c, i == len(chunks)-1))
			streamedBack(t, e.recv(), false)
		}
		require.NoError(t, e.closeAndWait())
	}
	const created = "event: response.created\n" +
		`data: {"type":"response.created","sequence_number":0,"response":{"id":"resp_stream1","object":"response","status":"in_progress"}}` + "\n\n"

	e, streamHome := route("POST", "/v1/responses", `{"model":"m","input":"hi","stream":true}`)
	respond(e, "text/event-stream", created[:40], created[40:90], created[90:]+"event: response.output_text.delta\ndata: {}\n\n")
	e, jsonHome := route("POST", "/v1/responses?x=1", `{"model":"m","input":"hi"}`)
	respond(e, "application/json", `{"id":"resp_json1","obj`, `ect":"response","status":"completed"}`)
	e, _ = route("POST", "/v1/chat/completions", `{"model":"m","messages":[]}`)
	respond(e, "application/json", `{"id":"resp_chat1","object":"chat.completion"}`)

	// streamHome is kept busy: least outstanding would choose another.
	route("POST", "/v1/responses", `{"model":"m","input":"more","previous_response_id":"resp_stream1"}`)

	// Unknown ids, and ids not of a Responses API response, are routed
	// by the policy.
	for _, body := range []string{
		`{"model":"m","input":"x","previous_response_id":"resp_unknown"}`,
		`{"model":"m","input":"x","previous_response_id":"resp_chat1"}`,
		`{"model":"m","input":"x","previous_response_id":"resp_st\u0072eam1"}`,
		`{"model":"m","input":"x","previous_response_id":"` + strings.Repeat("r", 300) + `"}`,
		`{"model":"m","input":"x","previous_response_id":17}`,
	} {
		e, got := route("POST", "/v1/responses", body)
		require.NotEqual(t, streamHome, got, "%s", body)
		e.cancel()
		require.Eventually(t, func() bool { return stats(b, got).Outstanding == 0 }, 5*time.Second, time.Millisecond)
	}
	_, got := route("GET", "/v1/responses/resp_unknown", "")
	require.NotEqual(t, streamHome, got)

	// Each request below stays in flight, so that least outstanding
	// would choose another endpoint than the last.
	for i := range 4 {
		_, got := route("POST", "/v1/responses", `{"model":"m","input":"more","previous_response_id":"resp_stream1"}`)
		require.Equal(t, streamHome, got, "continuation %d", i)
		_, got = route("POST", "/v1/responses", `{"previous_response_id":"resp_json1","model":"m","input":"more"}`)
		require.Equal(t, jsonHome, got, "continuation %d", i)
		_, got = route("GET", "/v1/responses/resp_stream1?stream=true", "")
		require.Equal(t, streamHome, got, "retrieve %d", i)
		_, got = route("POST", "/v1/responses/resp_json1/cancel", `{}`)
		require.Equal(t, jsonHome, got, "cancel %d", i)
		_, got = route("DELETE", "/v1/responses/resp_json1", "")
		require.Equal(t, jsonHome, got, "delete %d", i)
		// The path is decoded, as httplb and the engines decode it.
		_, got = route("GET", "/v1/responses/resp%5Fstream1", "")
		require.Equal(t, streamHome, got, "escaped retrieve %d", i)
		_, got = route("POST", "/v1/responses/%72esp_json1/cancel", `{}`)
		require.Equal(t, jsonHome, got, "escaped cancel %d", i)
	}
}

// TestStoredResponseID: the id of the stored response a request addresses
// is read, by the rules of package respid (internal/respid/respid_test.go
// has them, and every escape), in the path the parser is given (see
// TestParserRequestURL): the :path decoded, without its query, as net/http
// decodes it for httplb; a :path net/http refuses, or one not in origin
// form, addresses none.
func TestStoredResponseID(t *testing.T) {
	cases := []struct {
		method, path, want string // want "": none
	}{
		{"GET", "/v1/responses/resp%5F1", "resp_1"},
		{"GET", "/v1/responses/a%2Fb", ""},
		{"POST", "/v1/responses/resp_1%2Fcancel", "resp_1"},
		{"DELETE", "/v1/responses/%72esp_1", "resp_1"},
		{"PUT", "/v1/responses/resp_1", ""},
		{"GET", "/v1/responses/resp_1?stream=true", "resp_1"},
		{"GET", "/v1/responses/resp_1?q=%zz", "resp_1"},
		{"GET", "/v1/responses/resp%zz", ""},
		{"GET", "http://gw/v1/responses/resp_1", ""},
		{"GET", "", ""},
	}
	for _, c := range cases {
		id, ok := extproc.StoredResponseID(c.method, c.path)
		require.Equal(t, c.want, id, "%s %q", c.method, c.path)
		require.Equal(t, c.want != "", ok, "%s %q", c.method, c.path)
	}
}

// TestScanResponseID: the response's id is read however the body is cut,
// within the first 64 KiB; an id with an escape, or out of place, is not.
func TestScanResponseID(t *testing.T) {
	bytewise := func(s string) [][]byte {
		out := make([][]byte, len(s))
		for i := range s {
			out[i] = []byte(s[i : i+1])
		}
		return out
	}
	created := `data: {"type":"response.created","response":{"id":"resp_1","output":[]}}` + "\n\n"
	pad := `"pad":"` + strings.Repeat("x", 70<<10) + `",`
	cases := []struct {
		name   string
		sse    bool
		chunks [][]byte
		want   string // "": none
	}{
		{"sse", true, [][]byte{[]byte(created)}, "resp_1"},
		{"sse-bytewise", true, bytewise("event: response.created\r\n" + created), "resp_1"},
		{"sse-bom", true, [][]byte{[]byte("\uFEFF" + created)}, "resp_1"},
		{"sse-no-line-end", true, [][]byte{[]byte(strings.TrimSpace(created))}, ""},
		{"sse-other-event", true, [][]byte{[]byte(`data: {"type":"response.in_progress","response":{"id":"resp_1"}}` + "\n")}, ""},
		{"sse-late", true, [][]byte{[]byte(": " + strings.Repeat("x", 70<<10) + "\n"), []byte(created)}, ""},
		{"json", false, [][]byte{[]byte(`{"id":"resp_2","object":"response"}`)}, "resp_2"},
		{"json-bytewise", false, bytewise(`{"object":"response", "id" : "resp_2"}`), "resp_2"},
		{"json-late", false, [][]byte{[]byte(`{` + pad), []byte(`"id":"resp_2"}`)}, ""},
		{"json-nested", false, [][]byte{[]byte(`{"output":{"id":"resp_3"}}`)}, ""},
		{"json-escaped", false, [][]byte{[]byte(`{"id":"resp\u005f2"}`)}, ""},
		{"json-not-object", false, [][]byte{[]byte(`["id","resp_2"]`)}, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			id, ok := extproc.ScanResponseID(c.sse, c.chunks)
			require.Equal(t, c.want != "", ok)
			require.Equal(t, c.want, id)
		})
	}
}

// FuzzResponseID: reading a response's id, or a request's
// previous_response_id, from any bytes, cut anywhere, neither fails nor
// depends on the cut, and what is read is a plain id. Reading a stored
// response's id from any path neither fails nor reads what httplb would
// not: the id is the decoded path's segment after /responses/, within
// bounds, and escaping any of its bytes in the path reads the same id.
// Any :path gives the parser a URL without failing: net/http's for a path
// it accepts in origin form, the raw path and query for any other, which
// addresses no stored response.
func FuzzResponseID(f *testing.F) {
	f.Add([]byte(`data: {"type":"response.created","response":{"id":"resp_1"}}`+"\n"), uint16(9), true, "GET", "/v1/responses/resp%5F1")
	f.Add([]byte(`{"id":"resp_2","previous_response_id":"resp_1"}`), uint16(5), false, "POST", "/v1/responses/resp_1/cancel")
	f.Add([]byte(`{"a":[{"id":"x"}],"id":"y"`), uint16(3), false, "DELETE", "/v1/responses/a%2Fb")
	f.Add([]byte{}, uint16(0), false, "GET", "/v1/respons%65s/r%C3%A9sp/input_items?x=%zz")
	f.Add([]byte{}, uint16(0), false, "GET", "/v1/responses/%2E%2E")
	f.Add([]byte{}, uint16(0), false, "GET", "/v1/responses/resp%5")
	f.Add([]byte{}, uint16(0), false, "POST", "/v1/chat%2Fcompletions?")
	f.Add([]byte{}, uint16(0), false, "GET", "")
	f.Add([]byte{}, uint16(0), false, "GET", "http://gw/v1/responses/resp_1")
	f.Fuzz(func(t *testing.T, body []byte, cut uint16, sse bool, method, path string) {
		at := min(int(cut), len(body))
		whole, okWhole := extproc.ScanResponseID(sse, [][]byte{body})
		parts, okParts := extproc.ScanResponseID(sse, [][]byte{body[:at], body[at:]})
		require.Equal(t, okWhole, okParts)
		require.Equal(t, whole, parts)
		for _, id := range []string{whole, func() string { id, _ := extproc.PreviousResponseID(body); return id }()} {
			require.LessOrEqual(t, len(id), 256)
			require.False(t, strings.ContainsAny(id, "\"\\ \n"), "%q", id)
		}

		// The parser is given the URL net/http reads (see
		// TestParserRequestURL), and the stored response's id is read in
		// that URL's path, or, for a path net/http refuses, not at all.
		id, ok := extproc.StoredResponseID(method, path)
		r := extproc.ParserRequest(method, path)
		if u, err := url.ParseRequestURI(path); err == nil && strings.HasPrefix(path, "/") {
			require.Equal(t, u, r.URL, "%q", path)
		} else {
			raw, query, _ := strings.Cut(path, "?")
			require.Equal(t, &url.URL{Path: raw, RawQuery: query}, r.URL, "%q", path)
			require.False(t, ok, "%s %q: a path net/http refuses gave id %q", method, path, id)
		}
		if !ok {
			require.Empty(t, id)
			return
		}
		require.True(t, id != "" && len(id) <= 256 && id != "." && id != "..", "%s %q: id %q", method, path, id)
		for i := 0; i < len(id); i++ {
			require.False(t, id[i] <= ' ' || id[i] == 0x7f || id[i] == '/', "%s %q: id %q", method, path, id)
		}
		raw, _, _ := strings.Cut(path, "?")
		decoded, err := url.PathUnescape(raw)
		require.NoError(t, err, "%s %q: an invalid escape gave id %q", method, path, id)
		var suffix string
		switch {
		case method == http.MethodPost:
			suffix = "/cancel"
		case method == http.MethodGet && strings.HasSuffix(decoded, "/"+id+"/input_items"):
			suffix = "/input_items"
		case method != http.MethodGet && method != http.MethodDelete:
			t.Fatalf("%s %q: method accepted", method, path)
		}
		require.True(t, strings.HasSuffix(decoded, "/responses/"+id+suffix), "%s %q: id %q is not the segment after /responses/", method, path, id)
		// The same request with every byte of the id escaped.
		var esc strings.Builder
		for i := 0; i < len(id); i++ {
			fmt.Fprintf(&esc, "%%%02X", id[i])
		}
		segs := strings.Split(decoded[:len(decoded)-len(id+suffix)], "/")
		for i, seg := range segs {
			segs[i] = url.PathEscape(seg)
		}
		again, ok := extproc.StoredResponseID(method, strings.Join(segs, "/")+esc.String()+suffix)
		require.True(t, ok, "%s %q: id %q escaped is not read", method, path, id)
		require.Equal(t, id, again, "%s %q", method, path)
	})
}
