package main

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"sync"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/transport"
)

// listeners are the sockets of run's engines, all bound before any engine
// starts or any address is printed.
type listeners struct {
	// http is engine i's HTTP listener, nil once its Serve owns it.
	http []net.Listener
	// pub and replay are engine i's KV-event endpoints, with
	// -kv-events-port: the PUB and replay sockets, bound, for its
	// kvevents.Publisher to take (see preBound).
	pub, replay []string
	// kv holds the listeners bound for pub and replay, to release.
	kv []kvBound
}

// kvBound is a KV-event socket bound for a publisher: its endpoint and
// its listener.
type kvBound struct {
	ep string
	l  net.Listener
}

// listen binds the HTTP listener of each of addrs and, if kvPort is not 0,
// the KV-event sockets of engine i on host at kvPort+i and kvPort+i+1000.
// If one cannot be bound, it closes those it bound and returns the error.
func listen(addrs []string, host string, kvPort int) (*listeners, error) {
	if kvPort > 0 {
		if err := registerPreBound(); err != nil {
			return nil, err
		}
	}
	ls := &listeners{}
	for i, addr := range addrs {
		l, err := net.Listen("tcp", addr)
		if err != nil {
			ls.close()
			return nil, err
		}
		ls.http = append(ls.http, l)
		if kvPort == 0 {
			continue
		}
		for _, kv := range []struct {
			eps  *[]string
			port int
		}{{&ls.pub, kvPort + i}, {&ls.replay, kvPort + i + 1000}} {
			ep, l, err := bound.listen(net.JoinHostPort(host, strconv.Itoa(kv.port)))
			if err != nil {
				ls.close()
				return nil, fmt.Errorf("-kv-events-port: %w", err)
			}
			*kv.eps = append(*kv.eps, ep)
			ls.kv = append(ls.kv, kvBound{ep, l})
		}
	}
	return ls, nil
}

// close closes the listeners that no engine or publisher took.
func (ls *listeners) close() {
	for _, l := range ls.http {
		if l != nil {
			_ = l.Close()
		}
	}
	for _, kv := range ls.kv {
		bound.release(kv.ep, kv.l)
	}
}

// preBoundScheme names the zmq4 transport through which a
// kvevents.Publisher listens on a socket bound beforehand: a Publisher
// binds its sockets only once it runs, too late to report a port in use
// before the engines' addresses are printed.
const preBoundScheme = "llmlb-engine-bound"

// preBound is the zmq4 transport of preBoundScheme. Its Listen hands out
// the TCP listener bound for an endpoint, once; it does not dial. zmq4
// finds transports by name in a registry of its own, hence one value for
// the process.
type preBound struct {
	mu sync.Mutex // protects ls
	ls map[string]net.Listener
}

var (
	bound = &preBound{ls: make(map[string]net.Listener)}
	// registerPreBound registers bound with zmq4 under preBoundScheme,
	// once.
	registerPreBound = sync.OnceValue(func() error { return zmq4.RegisterTransport(preBoundScheme, bound) })
)

// listen binds addr and returns the endpoint under which the listener is
// handed out, and the listener.
func (b *preBound) listen(addr string) (string, net.Listener, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return "", nil, err
	}
	key := l.Addr().String()
	b.mu.Lock()
	b.ls[key] = l
	b.mu.Unlock()
	return preBoundScheme + "://" + key, l, nil
}

// release closes l, bound for ep, unless it was handed out: the socket
// that took it closes it, and another run may since have bound the same
// address, whose listener release leaves alone.
func (b *preBound) release(ep string, l net.Listener) {
	key := ep[len(preBoundScheme+"://"):]
	b.mu.Lock()
	held := b.ls[key] == l
	if held {
		delete(b.ls, key)
	}
	b.mu.Unlock()
	if held {
		_ = l.Close()
	}
}

// Listen hands out the listener bound for addr; the socket that takes it
// closes it.
func (b *preBound) Listen(_ context.Context, addr string) (net.Listener, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	l, ok := b.ls[addr]
	if !ok {
		return nil, fmt.Errorf("llmlb-engine: no socket bound for %s", addr)
	}
	delete(b.ls, addr)
	return l, nil
}

// Dial refuses: the transport only listens.
func (b *preBound) Dial(context.Context, transport.Dialer, string) (net.Conn, error) {
	return nil, fmt.Errorf("llmlb-engine: the %s transport does not dial", preBoundScheme)
}

// Addr returns the address of ep, ep itself.
func (b *preBound) Addr(ep string) (string, error) { return ep, nil }
