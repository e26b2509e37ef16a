package httplb

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

// BenchmarkPeek holds back the start of an event stream to its first
// event, as an attempt does: a chat stream's first chunk read at once or
// in reads of 16 bytes, and a Responses stream's first output after its
// preamble events.
func BenchmarkPeek(b *testing.B) {
	const chunk = "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n"
	streams := []struct {
		name, stream string
		read         int
	}{
		{"chat/reads=whole", chunk + chunk, 0},
		{"chat/reads=16", chunk + chunk, 16},
		{"responses/reads=whole", responsesStream([]string{`"a"`}, completed(1)), 0},
	}
	resp := &http.Response{Header: sseHeader}
	for _, s := range streams {
		b.Run(s.name, func(b *testing.B) {
			r := &pieceReader{}
			b.SetBytes(int64(len(s.stream)))
			b.ReportAllocs()
			for b.Loop() {
				r.reset(s.stream, s.read)
				body := body{rc: io.NopCloser(r)}
				if code, err := body.peek(resp, DefaultMaxPeekBytes); code != 0 || err != nil {
					b.Fatal(code, err)
				}
			}
		})
	}
}

// pieceReader reads a string in reads of at most n bytes, or whole if n
// is 0.
type pieceReader struct {
	r strings.Reader
	n int
}

func (p *pieceReader) reset(s string, n int) { p.r.Reset(s); p.n = n }

func (p *pieceReader) Read(b []byte) (int, error) {
	if p.n > 0 && len(b) > p.n {
		b = b[:p.n]
	}
	return p.r.Read(b)
}
