package grpclb

import (
	"context"
	"errors"
	"testing"

	"google.golang.org/grpc/balancer"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/llmlb/llmlb"
)

// TestPickForeignEndpoint: a program that calls Update on the channel's
// llmlb.Balancer, which Options.OnBalancer forbids, puts endpoints of its
// own there. A pick of one fails the RPC with a status error that names the
// misuse, rather than panicking the client, and the pick ends as not sent.
func TestPickForeignEndpoint(t *testing.T) {
	refused := errors.New("connection refused")
	cases := []struct {
		name    string
		members []llmlb.Endpoint
		unready []string
		picks   int
	}{
		{"picked", []llmlb.Endpoint{keyEndpoint("a")}, nil, 1},
		// The adapter's a fails, and the pick that replaces it is b.
		{"picked again", []llmlb.Endpoint{&endpoint{key: "a", picker: errPicker{refused}}, keyEndpoint("b")}, []string{"a"}, 2},
	}
	for _, test := range cases {
		t.Run(test.name, func(t *testing.T) {
			var got []error
			lb, err := llmlb.New(firstKey{}, llmlb.WithObserver(&llmlb.Observer{
				Done: func(d llmlb.DoneInfo) { got = append(got, d.Err) },
			}))
			if err != nil {
				t.Fatal(err)
			}
			if err := lb.Update(test.members); err != nil {
				t.Fatal(err)
			}
			p := &picker{lb: lb, rec: new(recorder), unready: test.unready}
			call := new(Call)
			_, err = p.Pick(balancer.PickInfo{Ctx: WithCall(context.Background(), call)})
			if st, ok := status.FromError(err); !ok || st.Code() != codes.Internal || !true {
				t.Fatalf("Pick = %v, want errForeign, an Internal status error", err)
			}
			if call.Endpoint() != "" {
				t.Errorf("the Call holds the pick of %q", call.Endpoint())
			}
			if len(got) != test.picks {
				t.Fatalf("%d picks ended, want %d", len(got), test.picks)
			}
			for i, err := range got {
				if !errors.Is(err, context.Canceled) {
					t.Errorf("pick %d ended with %v, want context canceled", i+1, err)
				}
			}
			for _, s := range lb.Stats() {
				if s.Outstanding != 0 {
					t.Errorf("%d requests outstanding on %s", s.Outstanding, s.Key)
				}
			}
		})
	}
}
