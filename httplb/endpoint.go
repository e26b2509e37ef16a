package httplb

import (
	"fmt"
	"net/url"
	"strings"

	"github.com/llmlb/llmlb"
)

// Endpoint is a replica reached over HTTP at a base URL, such as
// "http://10.0.0.7:8000". Its key is the base URL without a trailing slash.
// A request for path /v1/completions goes to the base URL's scheme and host,
// with the base URL's path, if any, prepended. A path prefix suits a replica
// behind a path-routing proxy, but the base URL is the server's, not its
// OpenAI API's: "http://10.0.0.7:8000", not "http://10.0.0.7:8000/v1", since
// the client's /v1/... path is forwarded as it was sent. A request whose
// path starts with /v1/ to a base URL whose path ends in /v1 fails, without
// a retry, with an error wrapping [ErrInvalidConfig] that says so (a base
// ending in /v1 suits requests whose /v1 was stripped, as by
// [net/http.StripPrefix]).
//
// An Endpoint is immutable and safe for concurrent use.
type Endpoint struct {
	key string
	u   *url.URL
}

// NewEndpoint returns the endpoint at base, an absolute http or https URL
// without query, fragment or user info (see [Endpoint]). It returns an error
// wrapping [ErrInvalidConfig] for anything else.
func NewEndpoint(base string) (*Endpoint, error) {
	if base != "" && !strings.Contains(base, "://") {
		// "10.0.0.7:8000" does not parse, and "localhost:8000" parses with
		// the scheme "localhost": say what is missing in both cases.
		return nil, configErrorf("endpoint %q: want an absolute http or https URL, such as %q", base, "http://"+base)
	}
	u, err := url.Parse(base)
	if err != nil {
		return nil, configErrorf("endpoint %q: %v", base, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, configErrorf("endpoint %q: want an absolute http or https URL", base)
	}
	if u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return nil, configErrorf("endpoint %q: query, fragment and user info are not allowed", base)
	}
	u.Path = strings.TrimRight(u.Path, "/")
	u.RawPath = ""
	return &Endpoint{key: u.String(), u: u}, nil
}

// checkBase reports an error, saying what to give instead, if the path of
// the base URL u ends in /v1, the OpenAI API's root rather than the
// server's.
func checkBase(u *url.URL) error {
	p := strings.TrimRight(u.Path, "/")
	if !strings.HasSuffix(p, "/v1") {
		return nil
	}
	server := url.URL{Scheme: u.Scheme, Host: u.Host, Path: strings.TrimSuffix(p, "/v1")}
	return fmt.Errorf("give the server's base URL, %s, without /v1: the client's /v1/... path is forwarded as it was sent", server.String())
}

// checkJoin refuses to append path, a request's, to the base URL u when
// both carry the API's /v1, which would double it.
func checkJoin(u *url.URL, path string) error {
	if path != "/v1" && !strings.HasPrefix(path, "/v1/") {
		return nil
	}
	return checkBase(u)
}

// Key returns the endpoint's base URL, its identity in an llmlb.Balancer.
func (e *Endpoint) Key() string { return e.key }

// URL returns a copy of the endpoint's base URL.
func (e *Endpoint) URL() *url.URL {
	u := *e.u
	return &u
}

// NewEndpoints returns an [*Endpoint] for each base URL, ready for
// [llmlb.Balancer.Update].
func NewEndpoints(bases ...string) ([]llmlb.Endpoint, error) {
	eps := make([]llmlb.Endpoint, 0, len(bases))
	for _, b := range bases {
		e, err := NewEndpoint(b)
		if err != nil {
			return nil, err
		}
		eps = append(eps, e)
	}
	return eps, nil
}
