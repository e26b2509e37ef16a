package main

import (
	"context"
	"net"
	"strconv"
	"testing"
)

// TestReleaseLeavesLaterBinds: a run whose publishers took their sockets
// and closed them, and which releases its listeners only after another run
// bound the same ports, leaves the other run's sockets bound for it.
func TestReleaseLeavesLaterBinds(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	if port+1000 > 65535 {
		t.Skip("no room for the replay port")
	}
	take := func(ls *listeners) {
		t.Helper()
		for _, ep := range append(append([]string(nil), ls.pub...), ls.replay...) {
			got, err := bound.Listen(context.Background(), ep[len(preBoundScheme+"://"):])
			if err != nil {
				t.Fatal(err)
			}
			got.Close()
		}
	}
	a, err := listen([]string{"127.0.0.1:0"}, "127.0.0.1", port)
	if err != nil {
		t.Skipf("port %d or %d taken meanwhile: %v", port, port+1000, err)
	}
	take(a)
	b, err := listen([]string{"127.0.0.1:0"}, "127.0.0.1", port)
	if err != nil {
		t.Fatalf("binding port %d again: %v", port, err)
	}
	defer b.close()
	a.close()
	for _, ep := range append(append([]string(nil), b.pub...), b.replay...) {
		got, err := bound.Listen(context.Background(), ep[len(preBoundScheme+"://"):])
		if err != nil {
			t.Fatalf("the second run's %s: %v", ep, err)
		}
		defer got.Close()
		if _, p, _ := net.SplitHostPort(got.Addr().String()); p != strconv.Itoa(port) && p != strconv.Itoa(port+1000) {
			t.Fatalf("listener on port %s, want %d or %d", p, port, port+1000)
		}
	}
}
