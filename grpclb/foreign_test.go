package grpclb_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/status"

	"github.com/llmlb/llmlb"
)

// ownEndpoint is an endpoint a program makes itself.
type ownEndpoint string

func (e ownEndpoint) Key() string { return string(e) }

// TestUpdateByProgramFailsRPC: a program that replaces the members of the
// channel's llmlb.Balancer with endpoints of its own (which the adapter
// owns, see Options.OnBalancer) gets its RPCs failed with an Internal
// status that says so, and the client process goes on.
func TestUpdateByProgramFailsRPC(t *testing.T) {
	s := startServer(t, 0.1, false)
	client, _, lb := dial(t, testName, `{}`, s)
	waitReady(t, lb, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// The adapter's next update of the membership (a connection's state
	// changed) undoes the program's: update again until a call meets it.
	eventually(t, "a call picked with the program's endpoints", func() bool {
		if err := lb().Update([]llmlb.Endpoint{ownEndpoint(s.addr)}); err != nil {
			t.Fatal(err)
		}
		_, err := client.UnaryCall(ctx, &testgrpc.SimpleRequest{})
		switch {
		case err == nil:
			return false
		case status.Code(err) != codes.Internal || !strings.Contains(err.Error(), "Update"):
			t.Fatalf("got %v, want an Internal status naming Update", err)
		}
		return true
	})
	assertIdle(t, lb())
}
