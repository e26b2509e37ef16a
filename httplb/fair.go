package httplb

import (
	"context"
	"mime"
	"net/http"

	"github.com/llmlb/llmlb/fair"
)

// sessionPrincipalPrefix prefixes the principal of a request that has a
// session but no tenant, so that a session key never names a tenant.
const sessionPrincipalPrefix = "session:"

// fairRequest returns what [Config.Queue] needs to know of the request: its
// principal (the tenant; with no tenant, the session key prefixed with
// "session:"; with neither, ""), its class (read from the trusted class
// header, if any, else fair.Standard) and its prompt tokens.
func (a *attempt) fairRequest() fair.Request {
	r := fair.Request{Principal: a.lreq.Tenant, PromptTokens: a.lreq.PromptTokens}
	if r.Principal == "" && a.lreq.AffinityKey != "" {
		r.Principal = sessionPrincipalPrefix + a.lreq.AffinityKey
	}
	if h := a.t.classHdr; h != "" {
		r.Class, _ = fair.ParseClass(a.req.Header.Get(h))
	}
	return r
}

// admitFair waits for the request's admission by the fair queue; the ticket
// is released with the admission caps, when the response body ends or the
// request fails.
func (a *attempt) admitFair(ctx context.Context) error {
	tk, err := a.t.queue.Admit(ctx, a.fairRequest())
	if err != nil {
		return err
	}
	a.ticket = tk
	rel := a.release
	a.release = func() {
		tk.Done()
		rel()
	}
	return nil
}

// meterOutput makes the body of resp, a 2xx response, charge the output it
// carries to the request's ticket as the caller reads it.
func (a *attempt) meterOutput(resp *http.Response, b *body) {
	if a.ticket == nil || resp.StatusCode < 200 || resp.StatusCode > 299 {
		return
	}
	m := &outputMeter{tk: a.ticket}
	if mt, _, err := mime.ParseMediaType(resp.Header.Get("Content-Type")); err == nil && mt == "text/event-stream" {
		ce := resp.Header.Get("Content-Encoding")
		m.sse = ce == "" || ce == "identity"
	}
	b.onRead = m.observe
}

// outputMeter estimates the output tokens of a response body from the bytes
// read, and charges them to a ticket as they pass: for an event stream, one
// token per event ("data:" line), which is one token per chunk for the
// OpenAI-compatible servers (a closing "data: [DONE]" or usage event adds
// one or two); for any other body, one token per [BytesPerToken] bytes. It
// is called from the goroutine reading the body, one pass over the bytes
// already read, and takes the queue's lock once per read that carries
// output.
type outputMeter struct {
	tk      *fair.Ticket
	sse     bool
	scan    eventCounter
	bytes   int64 // bytes seen, for a body that is not an event stream
	charged int64 // tokens charged so far
}

func (m *outputMeter) observe(p []byte) {
	var n int64
	if m.sse {
		n = int64(m.scan.count(p))
	} else {
		m.bytes += int64(len(p))
		n = m.bytes/BytesPerToken - m.charged
	}
	if n > 0 {
		m.charged += n
		m.tk.Charge(int(n))
	}
}

// eventCounter counts the "data:" fields at the start of a line of an event
// stream, across reads.
type eventCounter struct {
	m int // bytes of "data:" matched at the start of the current line; -1 if the line is something else
}

func (s *eventCounter) count(p []byte) int {
	n := 0
	for _, c := range p {
		switch {
		case c == '\n' || c == '\r':
			s.m = 0
		case s.m < 0:
		case c == dataField[s.m]:
			s.m++
			if s.m == len(dataField) {
				n++
				s.m = -1
			}
		default:
			s.m = -1
		}
	}
	return n
}
