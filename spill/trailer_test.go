package spill

import (
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"testing"

	"github.com/llmlb/llmlb/httplb"
)

// trailerUpstream answers every request with status, content type and
// body, then with trailers: X-Checksum, which names nothing, and each of
// accountHeaders, half of them announced in its Trailer header, half not.
func trailerUpstream(t *testing.T, h2 bool, status int, contentType, body string) *httptest.Server {
	t.Helper()
	up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		half := len(accountHeaders) / 4 * 2 // the pairs announced
		announced := []string{"X-Checksum"}
		for i := 0; i < half; i += 2 {
			announced = append(announced, accountHeaders[i])
		}
		w.Header().Set("Trailer", strings.Join(announced, ", "))
		w.Header().Set("Content-Type", contentType)
		w.WriteHeader(status)
		fmt.Fprint(w, body)
		// Flushed, the body has no length, and so the answer may carry
		// trailers.
		w.(http.Flusher).Flush()
		w.Header().Set("X-Checksum", "crc32=1234")
		for i := 0; i < len(accountHeaders); i += 2 {
			k := accountHeaders[i]
			if i >= half {
				k = http.TrailerPrefix + k
			}
			w.Header().Set(k, accountHeaders[i+1])
		}
	}))
	if h2 {
		up.EnableHTTP2 = true
		up.StartTLS()
	} else {
		up.Start()
	}
	t.Cleanup(up.Close)
	return up
}

// A Transport used without httplb's proxy, behind a plain
// httputil.ReverseProxy, passes on none of a tier's trailers that name
// the operator's account or are the tier's own, as it passes on no such
// header: not their values, which arrive after the body, announced or
// not, nor the names its Trailer header announces before the body, over
// HTTP/1.1 or HTTP/2. Its other trailers reach the client; an answer
// whose body is replaced with a generic one has none.
func TestTransportDropsAccountTrailers(t *testing.T) {
	cases := []struct {
		name        string
		status      int
		contentType string
		body        string
		kept        bool // the tier's other trailers reach the client
	}{
		{"200 stream", http.StatusOK, "text/event-stream", "data: {\"i\":0}\n\ndata: [DONE]\n\n", true},
		{"200", http.StatusOK, "application/json", `{"id":"chatcmpl-1","choices":[]}`, true},
		{"400, read ahead", http.StatusBadRequest, "application/json", `{"error":{"message":"bad temperature"}}`, true},
		{"500", http.StatusInternalServerError, "text/plain", "Traceback: worker 3 died", false},
	}
	for _, h2 := range []bool{false, true} {
		for _, c := range cases {
			t.Run(fmt.Sprintf("%s/http2=%v", c.name, h2), func(t *testing.T) {
				up := trailerUpstream(t, h2, c.status, c.contentType, c.body)
				tr, err := New(Config{Tiers: []Tier{{Name: "a", Transport: up.Client().Transport}}, Logger: slog.New(slog.DiscardHandler)})
				if err != nil {
					t.Fatal(err)
				}
				target, _ := url.Parse(up.URL)
				gw := httptest.NewServer(&httputil.ReverseProxy{
					Rewrite:   func(pr *httputil.ProxyRequest) { pr.SetURL(target) },
					Transport: tr,
				})
				defer gw.Close()
				client := &http.Client{Transport: &http.Transport{}}
				defer client.CloseIdleConnections()
				resp, err := client.Post(gw.URL+"/v1/chat/completions", "application/json", strings.NewReader("{}"))
				if err != nil {
					t.Fatal(err)
				}
				body, err := io.ReadAll(resp.Body)
				_ = resp.Body.Close()
				if err != nil {
					t.Fatal(err)
				}
				if resp.StatusCode != c.status || c.kept && string(body) != c.body {
					t.Fatalf("got %d %q", resp.StatusCode, body)
				}
				announced := strings.Join(resp.Header.Values("Trailer"), ",")
				for i := 0; i < len(accountHeaders); i += 2 {
					k := accountHeaders[i]
					if v := resp.Trailer.Values(k); len(v) > 0 {
						t.Errorf("%s: %q reached the client as a trailer", k, v)
					}
					if _, ok := resp.Trailer[http.CanonicalHeaderKey(k)]; ok || strings.Contains(announced, http.CanonicalHeaderKey(k)) {
						t.Errorf("%s was announced to the client as a trailer (%q)", k, announced)
					}
				}
				switch got := resp.Trailer.Get("X-Checksum"); {
				case c.kept && got != "crc32=1234":
					t.Errorf("X-Checksum %q, want the tier's crc32=1234: a trailer that names nothing is kept", got)
				case !c.kept && len(resp.Trailer) > 0:
					t.Errorf("trailers %v: a replaced body's trailers are the tier body's", resp.Trailer)
				}
			})
		}
	}
}

// endReader returns head, then ends as a net/http body does: the Read
// that reaches the end adds the answer's trailers to its Trailer, on the
// goroutine that reads it, before it returns. ending is closed as that
// Read starts, and it returns once release is closed.
type endReader struct {
	head    string
	ending  chan struct{}
	release chan struct{}
	resp    *http.Response
}

func (r *endReader) Read(p []byte) (int, error) {
	if r.head != "" {
		n := copy(p, r.head)
		r.head = r.head[n:]
		return n, nil
	}
	close(r.ending)
	r.resp.Trailer["Server"] = []string{"uvicorn"}
	r.resp.Trailer["X-Checksum"] = []string{"crc32=1234"}
	<-r.release
	return 0, io.EOF
}

// A body that a read ahead is still reading (a 400 whose end is slow to
// come) is returned with an answer of its own, whose trailers are
// stripped now, of the names announced, and as the body ends, of those
// that follow it: the read ahead's goroutine may be adding them to the
// answer it reads meanwhile, and an answer's Trailer must not be used
// while its body is read (go test -race tells). An answer whose read
// ahead has ended is returned as it is.
func TestTrailerStrippedAfterReadAhead(t *testing.T) {
	const body = `{"error":{"message":"bad"}}`
	for _, ended := range []bool{false, true} {
		resp := &http.Response{StatusCode: http.StatusBadRequest, Header: http.Header{}, Trailer: http.Header{"Server": nil, "X-Checksum": nil}}
		r := &endReader{head: body, ending: make(chan struct{}), release: make(chan struct{}), resp: resp}
		resp.Body = io.NopCloser(r)
		p := readAhead(resp)
		<-r.ending
		if ended {
			close(r.release)
			<-p.done
		}
		got := detach(resp)
		if (got == resp) != ended {
			t.Fatalf("read ahead ended %v: the answer itself returned %v", ended, got == resp)
		}
		stripTrailer(got)
		if _, ok := got.Trailer["Server"]; ok || len(got.Trailer) != 1 {
			t.Fatalf("announced trailers %v, want X-Checksum alone", got.Trailer)
		}
		if !ended {
			close(r.release)
		}
		b, err := io.ReadAll(got.Body)
		if err != nil || string(b) != body {
			t.Fatalf("read %q, %v", b, err)
		}
		if _, ok := got.Trailer["Server"]; ok || got.Trailer.Get("X-Checksum") != "crc32=1234" {
			t.Fatalf("trailers at the body's end %v, want X-Checksum alone", got.Trailer)
		}
	}
}

// secret is what a tier's error event may tell that no client should
// read.
const secret = "Traceback: /srv/vllm/worker.py line 7, 10.1.2.3"

// Behind httplb's proxy, a stream from an httplb.Transport tier has its
// error events rewritten as it would without the Transport in between,
// which wraps its body to strip its trailers: the first event of a stream
// that fails at once, and a later one, reach the client with a generic
// message.
func TestProxyRewritesTierErrorEvents(t *testing.T) {
	const token = "data: {\"i\":0}\n\n"
	for _, stream := range []string{
		"event: error\ndata: {\"message\": \"" + secret + "\"}\n\n",
		token + "data: {\"error\": {\"message\": \"" + secret + "\", \"type\": \"InternalServerError\", \"code\": 500}}\n\ndata: [DONE]\n\n",
	} {
		up := trailerUpstream(t, false, http.StatusOK, "text/event-stream", stream)
		base := &http.Transport{}
		defer base.CloseIdleConnections()
		tierTr := oneEndpointTier(t, up.URL, base)
		log := slog.New(slog.DiscardHandler)
		tr, err := New(Config{Tiers: []Tier{{Name: "a", Transport: tierTr}}, Logger: log})
		if err != nil {
			t.Fatal(err)
		}
		proxy := httplb.NewProxy(nil)
		proxy.Transport = tr
		proxy.ModifyResponse = httplb.NewUpstreamErrorHandler(log)
		gw := httptest.NewServer(proxy)
		resp, err := http.Post(gw.URL+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"m","stream":true}`))
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		gw.Close()
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(body), secret) || !strings.Contains(string(body), "The upstream failed to answer.") {
			t.Errorf("%q reached the client as %q", stream, body)
		}
		if resp.Trailer.Get("Openai-Organization") != "" || resp.Trailer.Get("X-Checksum") != "crc32=1234" {
			t.Errorf("trailers %v", resp.Trailer)
		}
	}
}
