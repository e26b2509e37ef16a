package spill

import (
	"bytes"
	"compress/flate"
	"compress/gzip"
	"compress/zlib"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"

	"github.com/andybalholm/brotli"
	"github.com/klauspost/compress/zstd"
)

// A context-length error compressed for a client that accepts it (the
// gateway passes the client's Accept-Encoding on, and net/http then leaves
// the body as it came) still spills, and reaches the next tier's client
// unchanged when it does not.
func TestContextLengthCompressed(t *testing.T) {
	const contextLength = `{"error":{"message":"This model's maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}`
	const other = `{"error":{"message":"bad temperature","type":"invalid_request_error"}}`
	for _, c := range []struct {
		name, enc string
		newWriter func(io.Writer) io.WriteCloser
	}{
		{"gzip", "gzip", func(w io.Writer) io.WriteCloser { return gzip.NewWriter(w) }},
		{"x-gzip", "x-gzip", func(w io.Writer) io.WriteCloser { return gzip.NewWriter(w) }},
		{"deflate", "deflate", func(w io.Writer) io.WriteCloser { return zlib.NewWriter(w) }},
		{"raw deflate", "deflate", func(w io.Writer) io.WriteCloser { z, _ := flate.NewWriter(w, flate.DefaultCompression); return z }},
		{"br", "br", func(w io.Writer) io.WriteCloser { return brotli.NewWriter(w) }},
		{"zstd", "zstd", func(w io.Writer) io.WriteCloser { z, _ := zstd.NewWriter(w); return z }},
		{"gzip then br", "gzip, br", func(w io.Writer) io.WriteCloser { return stacked(w, gzipWriter, brotliWriter) }},
		{"zstd then deflate", "zstd,deflate", func(w io.Writer) io.WriteCloser { return stacked(w, zstdWriter, zlibWriter) }},
	} {
		enc, newWriter := c.enc, c.newWriter
		for _, tc := range []struct {
			body  string
			spill bool
		}{{contextLength, true}, {other, false}} {
			t.Run(c.name+"/spill="+map[bool]string{true: "yes", false: "no"}[tc.spill], func(t *testing.T) {
				var zipped bytes.Buffer
				w := newWriter(&zipped)
				_, _ = io.WriteString(w, tc.body)
				_ = w.Close()
				srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					if !strings.Contains(r.Header.Get("Accept-Encoding"), enc) {
						t.Errorf("Accept-Encoding %q", r.Header.Get("Accept-Encoding"))
					}
					w.Header().Set("Content-Type", "application/json")
					w.Header().Set("Content-Encoding", enc)
					w.WriteHeader(http.StatusBadRequest)
					_, _ = w.Write(zipped.Bytes())
				}))
				defer srv.Close()
				upstream := srv.Client().Transport
				first := http.RoundTripper(roundTripFunc(func(r *http.Request) (*http.Response, error) {
					r = r.Clone(r.Context())
					r.URL.Scheme, r.URL.Host, r.Host = "http", srv.Listener.Addr().String(), ""
					return upstream.RoundTrip(r)
				}))
				second := &tier{answer: status(200, "ok")}
				tr, err := New(Config{Tiers: []Tier{{Name: "small", Transport: first}, {Name: "large", Transport: second}}})
				if err != nil {
					t.Fatal(err)
				}
				r, _ := http.NewRequest("POST", "http://gateway/v1/chat/completions", strings.NewReader(`{}`))
				r.Header.Set("Accept-Encoding", enc)
				resp, err := tr.RoundTrip(r)
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Body.Close()
				got, _ := io.ReadAll(resp.Body)
				if tc.spill {
					if resp.StatusCode != 200 || second.sent() != 1 || resp.Header.Get(DefaultHeader) != "small" {
						t.Fatalf("a %s context-length error did not spill: %d, %d sent to the next tier", enc, resp.StatusCode, second.sent())
					}
					return
				}
				if resp.StatusCode != 400 || second.sent() != 0 {
					t.Fatalf("another 400 spilled: %d, %d sent to the next tier", resp.StatusCode, second.sent())
				}
				if !bytes.Equal(got, zipped.Bytes()) || resp.Header.Get("Content-Encoding") != enc {
					t.Fatalf("the compressed 400 was changed: %q, Content-Encoding %q", got, resp.Header.Get("Content-Encoding"))
				}
			})
		}
	}
}

func gzipWriter(w io.Writer) io.WriteCloser   { return gzip.NewWriter(w) }
func zlibWriter(w io.Writer) io.WriteCloser   { return zlib.NewWriter(w) }
func brotliWriter(w io.Writer) io.WriteCloser { return brotli.NewWriter(w) }
func zstdWriter(w io.Writer) io.WriteCloser {
	z, err := zstd.NewWriter(w)
	if err != nil {
		panic(err)
	}
	return z
}

// stacked returns a writer that applies first, then second, to what it
// is given, writing the result to w: Content-Encoding "first, second".
func stacked(w io.Writer, first, second func(io.Writer) io.WriteCloser) io.WriteCloser {
	outer := second(w)
	inner := first(outer)
	return closers{inner, outer}
}

type closers [2]io.WriteCloser

func (c closers) Write(p []byte) (int, error) { return c[0].Write(p) }
func (c closers) Close() error {
	if err := c[0].Close(); err != nil {
		return err
	}
	return c[1].Close()
}

// A compressed answer that decodes to far more than is peeked, as a small
// body of zeros does, is decoded no further than maxPeekBytes, whatever
// its encoding.
func TestDecodedIsBounded(t *testing.T) {
	zeros := make([]byte, 1<<20)
	for _, c := range []struct {
		enc       string
		newWriter func(io.Writer) io.WriteCloser
	}{{"gzip", gzipWriter}, {"deflate", zlibWriter}, {"br", brotliWriter}, {"zstd", zstdWriter}} {
		t.Run(c.enc, func(t *testing.T) {
			var b bytes.Buffer
			w := c.newWriter(&b)
			_, _ = w.Write(zeros)
			_ = w.Close()
			head := b.Bytes()[:min(b.Len(), maxPeekBytes)]
			got := decoded(head, c.enc)
			if len(got) != maxPeekBytes {
				t.Fatalf("%d bytes decoded from %d, want %d", len(got), len(head), maxPeekBytes)
			}
		})
	}
}

// Each coding of a list is decoded no further than maxPeekBytes, not only
// the text: an inner coding can read a great deal and produce nothing, as
// gzip does for empty members, which the outer coding makes from a few
// bytes (2 KiB of "gzip, gzip, gzip" was 300 MB of empty members, seconds
// of work for every answer). A refusal behind more than maxPeekBytes of
// empty members is not read.
func TestDecodedBoundsEachCoding(t *testing.T) {
	var member bytes.Buffer
	w := gzip.NewWriter(&member)
	_ = w.Close()
	var inner bytes.Buffer
	for inner.Len() <= 2*maxPeekBytes {
		inner.Write(member.Bytes())
	}
	w = gzip.NewWriter(&inner)
	_, _ = io.WriteString(w, `{"error":{"code":"context_length_exceeded"}}`)
	_ = w.Close()
	var b bytes.Buffer
	w = gzip.NewWriter(&b)
	_, _ = w.Write(inner.Bytes())
	_ = w.Close()
	if b.Len() > maxPeekBytes {
		t.Fatalf("%d bytes, more than are peeked", b.Len())
	}
	if got := decoded(inner.Bytes(), "gzip"); !bytes.Contains(got, []byte("context_length_exceeded")) {
		t.Fatalf("the inner coding alone decoded to %q", got)
	}
	if got := decoded(b.Bytes(), "gzip, gzip"); len(got) != 0 {
		t.Fatalf("decoded %q past maxPeekBytes of the inner coding", got)
	}
}

// A Content-Encoding of more codings than are undone is refused before it
// is split: a header of a million commas was split into a million strings,
// 16 MiB for every answer.
func TestDecodedManyCodings(t *testing.T) {
	enc := strings.Repeat(",", 1<<20)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	got := decoded([]byte("x"), enc)
	runtime.ReadMemStats(&after)
	if got != nil {
		t.Fatalf("decoded %q", got)
	}
	if n := after.TotalAlloc - before.TotalAlloc; n > uint64(len(enc)) {
		t.Fatalf("%d bytes allocated for a header of %d", n, len(enc))
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// FuzzContextLengthEncoded: a 400 with any bytes under any of the encodings
// read is classified without a panic, and one that stays keeps its whole
// body, as it came.
func FuzzContextLengthEncoded(f *testing.F) {
	var gz bytes.Buffer
	w := gzip.NewWriter(&gz)
	_, _ = io.WriteString(w, `{"error":{"code":"context_length_exceeded"}}`)
	_ = w.Close()
	f.Add("gzip", gz.Bytes())
	f.Add("gzip", gz.Bytes()[:gz.Len()/2])
	f.Add("deflate", []byte{0x78, 0x9c, 0x01, 0x02})
	f.Add("br", []byte("x"))
	for _, enc := range []struct {
		name      string
		newWriter func(io.Writer) io.WriteCloser
	}{{"br", brotliWriter}, {"zstd", zstdWriter}} {
		var b bytes.Buffer
		w := enc.newWriter(&b)
		_, _ = io.WriteString(w, `{"error":{"code":"context_length_exceeded"}}`)
		_ = w.Close()
		f.Add(enc.name, b.Bytes())
		f.Add("gzip, "+enc.name, b.Bytes())
	}
	f.Fuzz(func(t *testing.T, enc string, body []byte) {
		h := http.Header{}
		h.Set("Content-Encoding", enc)
		resp := &http.Response{StatusCode: http.StatusBadRequest, Header: h, Body: io.NopCloser(bytes.NewReader(body))}
		reason, spill := DefaultSpill(resp, nil)
		if spill != (reason == ContextLength) {
			t.Fatalf("spill %v with reason %q", spill, reason)
		}
		got, err := io.ReadAll(resp.Body)
		if err != nil || !bytes.Equal(got, body) {
			t.Fatalf("body changed: %d bytes, want %d", len(got), len(body))
		}
	})
}
