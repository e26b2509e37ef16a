package grpclb_test

import (
	"context"
	"encoding/json"
	"testing"

	"google.golang.org/grpc/balancer"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/serviceconfig"

	"github.com/llmlb/llmlb/grpclb"
)

// twiceName is the name of a parent policy whose only child is an llmlb
// balancer and whose picker calls each pick's Done twice.
const twiceName = "llmlb-test-twice"

// twiceBuilder builds the parent policy over child, an unregistered
// Builder.
type twiceBuilder struct{ child *grpclb.Builder }

func (b twiceBuilder) Name() string { return twiceName }

func (b twiceBuilder) Build(cc balancer.ClientConn, opts balancer.BuildOptions) balancer.Balancer {
	return b.child.Build(&twiceCC{ClientConn: cc}, opts)
}

func (b twiceBuilder) ParseConfig(js json.RawMessage) (serviceconfig.LoadBalancingConfig, error) {
	return b.child.ParseConfig(js)
}

// twiceCC wraps the pickers the child publishes in twicePickers.
type twiceCC struct{ balancer.ClientConn }

func (c *twiceCC) UpdateState(s balancer.State) {
	s.Picker = twicePicker{s.Picker}
	c.ClientConn.UpdateState(s)
}

type twicePicker struct{ balancer.Picker }

func (p twicePicker) Pick(info balancer.PickInfo) (balancer.PickResult, error) {
	r, err := p.Picker.Pick(info)
	if done := r.Done; err == nil && done != nil {
		r.Done = func(di balancer.DoneInfo) {
			done(di)
			done(di)
		}
	}
	return r, err
}

// TestDoneCalledTwice: a parent policy that calls a pick's Done twice in a
// row, with or without the server's per-call ORCA report, neither crashes
// the channel nor corrupts the accounting of other calls.
func TestDoneCalledTwice(t *testing.T) {
	for _, test := range []struct {
		name string
		kv   float64
	}{{"report", 0.1}, {"no report", -1}} {
		t.Run(test.name, func(t *testing.T) {
			servers := []*testServer{startServer(t, test.kv, false), startServer(t, test.kv, false)}
			client, _, lb := dial(t, twiceName, `{"policy": "least-outstanding"}`, servers...)
			waitReady(t, lb, 2)
			for i := range 50 {
				if _, err := client.UnaryCall(context.Background(), &testgrpc.SimpleRequest{}); err != nil {
					t.Fatalf("call %d: %v", i, err)
				}
			}
			assertIdle(t, lb())
		})
	}
}
