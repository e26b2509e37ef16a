package httplb

import (
	"errors"
	"io"
	"net/http"
	"strings"
)

// errBadUpgrade is the error of an attempt answered with a 101 Switching
// Protocols that the request did not ask for.
var errBadUpgrade = errors.New("httplb: upstream switched to a protocol the request did not ask for")

// checkUpgrade returns an error unless resp, a 101 Switching Protocols
// answer to a request with header h, switches to the protocol h asks for, as
// RFC 9110 requires, and has the switched connection, writable, as its body.
// A caller such as [httputil.ReverseProxy] refuses any other 101 without
// closing its body, which would never finish the attempt.
func checkUpgrade(h http.Header, resp *http.Response) error {
	want, got := upgradeType(h), upgradeType(resp.Header)
	if _, ok := resp.Body.(io.ReadWriteCloser); !ok || got == "" || !sameProtocol(got, want) {
		return errBadUpgrade
	}
	return nil
}

// upgradeType returns the protocol h's Upgrade header names if its
// Connection header has the upgrade option, else "".
func upgradeType(h http.Header) string {
	for _, v := range h["Connection"] {
		for opt := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(strings.TrimSpace(opt), "upgrade") {
				return h.Get("Upgrade")
			}
		}
	}
	return ""
}

// sameProtocol reports whether got, printable ASCII, equals want but for
// the case of ASCII letters.
func sameProtocol(got, want string) bool {
	if len(got) != len(want) {
		return false
	}
	for i := 0; i < len(got); i++ {
		if c := got[i]; c < ' ' || c > '~' || lowerASCII(c) != lowerASCII(want[i]) {
			return false
		}
	}
	return true
}

func lowerASCII(c byte) byte {
	if 'A' <= c && c <= 'Z' {
		return c + 'a' - 'A'
	}
	return c
}

// proxiedKey marks the context of an upgrade request that NewProxy
// forwards: the request ends when its handler returns.
type proxiedKey struct{}

// upgradeBody is the body of a 101 Switching Protocols answer: the switched
// connection, which the caller also writes to.
type upgradeBody struct {
	*body
	w io.Writer
}

// Write implements io.Writer.
func (u upgradeBody) Write(p []byte) (int, error) { return u.w.Write(p) }
