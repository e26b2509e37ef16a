package httplb

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Two spellings of one replica's base URL are one key: the scheme and host
// are case-insensitive, and the scheme's default port is implied. The path
// and an IPv6 zone (an interface name) keep their case; other ports stay.
func TestNewEndpointCanonicalKey(t *testing.T) {
	cases := []struct{ base, key string }{
		{"http://Host:8000", "http://host:8000"},
		{"HTTP://HOST:8000/", "http://host:8000"},
		{"http://host:80", "http://host"},
		{"http://host:80/", "http://host"},
		{"http://host:/", "http://host"},
		{"https://Gateway.Example:443/Team-A/", "https://gateway.example/Team-A"},
		{"https://host:80", "https://host:80"},
		{"http://host:443", "http://host:443"},
		{"http://[FE80::1%25EN0]:8000", "http://[fe80::1%25EN0]:8000"},
		{"http://[::1]:80", "http://[::1]"},
		{"http://[::1]", "http://[::1]"},
		{"http://10.0.0.7:8000", "http://10.0.0.7:8000"},
	}
	for _, c := range cases {
		e, err := NewEndpoint(c.base)
		require.NoError(t, err, c.base)
		assert.Equal(t, c.key, e.Key(), c.base)
		assert.Equal(t, c.key, e.URL().String(), c.base)
		// The key is a fixed point: a key given back is the same replica.
		again, err := NewEndpoint(e.Key())
		require.NoError(t, err, c.base)
		assert.Equal(t, e.Key(), again.Key(), c.base)
	}
}

// A base URL whose key would not parse back is refused: an IPv6 zone of
// raw bytes that a URL must escape, which url.Parse accepts but refuses
// escaped.
func TestNewEndpointZoneWithoutKey(t *testing.T) {
	_, err := NewEndpoint("http://[::%25\xe5]")
	assert.ErrorIs(t, err, ErrInvalidConfig)
	e, err := NewEndpoint("http://[::1%25eth0]:8000")
	require.NoError(t, err)
	assert.Equal(t, "http://[::1%25eth0]:8000", e.Key())
}

// A list that names one replica twice, however spelled, is refused with an
// error that shows both spellings.
func TestNewEndpointsSameReplicaTwice(t *testing.T) {
	for _, pair := range [][2]string{
		{"http://Host:8000", "http://host:8000"},
		{"http://host:80", "http://host/"},
		{"http://h:1", "http://h:1"},
	} {
		_, err := NewEndpoints("http://other:1", pair[0], pair[1])
		assert.ErrorIs(t, err, ErrInvalidConfig, pair)
		assert.ErrorContains(t, err, `"`+pair[1]+`" is the same replica as "`+pair[0]+`"`)
	}
	eps, err := NewEndpoints("http://host:8000", "http://host:8001", "https://host:8000")
	require.NoError(t, err)
	assert.Len(t, eps, 3)
}

// FuzzNewEndpoint checks that NewEndpoint refuses a base URL only with
// ErrInvalidConfig, and that the key of one it takes is its own canonical
// form: the same replica, whose key and URL agree.
func FuzzNewEndpoint(f *testing.F) {
	for _, s := range []string{"http://Host:80/", "https://[FE80::1%25EN0]:443/P/", "http://h:/", "HTTP://H:8000/v1/", "http://[::1]:", "http://a:b:c"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, base string) {
		e, err := NewEndpoint(base)
		if err != nil {
			if !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("%q: %v", base, err)
			}
			return
		}
		if e.URL().String() != e.Key() {
			t.Fatalf("%q: URL %q, key %q", base, e.URL(), e.Key())
		}
		again, err := NewEndpoint(e.Key())
		if err != nil || again.Key() != e.Key() {
			t.Fatalf("%q: key %q gives %v, %v", base, e.Key(), again, err)
		}
	})
}
