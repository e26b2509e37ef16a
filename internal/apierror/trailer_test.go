package apierror

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

// endingBody returns its text, then adds the trailers that follow it to
// resp, as a net/http body does in the Read that reaches its end.
type endingBody struct {
	io.Reader
	resp *http.Response
}

func (b *endingBody) Read(p []byte) (int, error) {
	n, err := b.Reader.Read(p)
	if err == io.EOF {
		b.resp.Trailer["Server"] = []string{"uvicorn"}
		b.resp.Trailer["X-Checksum"] = []string{"crc32=1234"}
	}
	return n, err
}

func (*endingBody) Close() error { return nil }

// The trailers that arrive with a body's end lose what StripUpstream
// strips, and the wrapper unwraps to the body it reads.
func TestStripTrailerAtEnd(t *testing.T) {
	resp := &http.Response{Trailer: http.Header{}}
	inner := &endingBody{Reader: strings.NewReader("body"), resp: resp}
	resp.Body = inner
	StripTrailerAtEnd(resp)
	if u, ok := resp.Body.(interface{ Unwrap() io.ReadCloser }); !ok || u.Unwrap() != inner {
		t.Fatalf("%T does not unwrap to the body it reads", resp.Body)
	}
	got, err := io.ReadAll(resp.Body)
	if err != nil || string(got) != "body" {
		t.Fatalf("read %q, %v", got, err)
	}
	if _, ok := resp.Trailer["Server"]; ok || resp.Trailer.Get("X-Checksum") != "crc32=1234" {
		t.Fatalf("trailers at the body's end %v, want X-Checksum alone", resp.Trailer)
	}
}
