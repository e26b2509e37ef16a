package httplb

import (
	"fmt"
	"net/url"
	"strings"

	"github.com/llmlb/llmlb"
)

// Endpoint is a replica reached over HTTP at a base URL, such as
// "http://10.0.0.7:8000". Its key is the base URL in a canonical form (see
// [NewEndpoint]), so that two spellings of one replica are one key.
// A request for path /v1/completions goes to the base URL's scheme and host,
// with the base URL's path, if any, prepended. A path prefix suits a replica
// behind a path-routing proxy, but the base URL is the server's, not its
// OpenAI API's: "http://10.0.0.7:8000", not "http://10.0.0.7:8000/v1", since
// the client's /v1/... path is forwarded as it was sent, but for its dot
// segments ("/v1/../x", escaped or not), which are resolved first, so that
// no request climbs out of the base URL's path. A request whose
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
// with a host (not only a port) and without query, fragment or user info
// (see [Endpoint]). It returns an error
// wrapping [ErrInvalidConfig] for anything else.
//
// The endpoint's key, and the URL requests go to, is base in a canonical
// form: its scheme and host in lower case (host names are case-insensitive;
// an IPv6 zone, an interface name, is kept as given), without the scheme's
// default port (80 for http, 443 for https) or an empty one, and without a
// trailing slash. "HTTP://Host:80/" and "http://host" are thus one replica,
// "http://host". The path keeps its case.
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
	if (u.Scheme != "http" && u.Scheme != "https") || u.Hostname() == "" {
		return nil, configErrorf("endpoint %q: want an absolute http or https URL", base)
	}
	if u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return nil, configErrorf("endpoint %q: query, fragment and user info are not allowed", base)
	}
	u.Host = canonicalHost(u.Scheme, u.Host)
	u.Path = strings.TrimRight(u.Path, "/")
	u.RawPath = ""
	key := u.String()
	// The key is the endpoint's name wherever it is written, and names it
	// again when parsed: an IPv6 zone of bytes a URL must escape, which
	// url.Parse accepts raw ("[::1%25\xe5]") but not escaped, has no key.
	if _, err := url.Parse(key); err != nil {
		return nil, configErrorf("endpoint %q: %v", base, err)
	}
	return &Endpoint{key: key, u: u}, nil
}

// canonicalHost returns host, the host[:port] of a URL with the given
// (lower-case) scheme, with its name in lower case, except an IPv6 zone,
// and without the scheme's default port or an empty port.
func canonicalHost(scheme, host string) string {
	name, port := host, ""
	if i := strings.LastIndexByte(host, ':'); i >= 0 && !strings.Contains(host[i:], "]") {
		name, port = host[:i], host[i+1:]
	}
	if scheme == "http" && port == "80" || scheme == "https" && port == "443" {
		port = ""
	}
	zone := ""
	if i := strings.IndexByte(name, '%'); strings.HasPrefix(name, "[") && i >= 0 {
		name, zone = name[:i], name[i:]
	}
	name = strings.ToLower(name) + zone
	if port == "" {
		return name
	}
	return name + ":" + port
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
// [llmlb.Balancer.Update]. It returns an error wrapping [ErrInvalidConfig]
// for a base URL that [NewEndpoint] refuses, or for two that name the same
// replica, however spelled ("http://Host:8000" and "http://host:8000/").
func NewEndpoints(bases ...string) ([]llmlb.Endpoint, error) {
	eps := make([]llmlb.Endpoint, 0, len(bases))
	seen := make(map[string]string, len(bases)) // key -> the base URL first given for it
	for _, b := range bases {
		e, err := NewEndpoint(b)
		if err != nil {
			return nil, err
		}
		if first, dup := seen[e.key]; dup {
			return nil, configErrorf("endpoint %q is the same replica as %q: both are %s", b, first, e.key)
		}
		seen[e.key] = b
		eps = append(eps, e)
	}
	return eps, nil
}
