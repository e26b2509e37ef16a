package fair

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"
)

// TestMixedClassesProperty runs a seeded random sequence of arrivals of
// every class from a few principals that each use several classes at once,
// with releases, charges, abandonments at every stage (queued, admitted as
// the context ends, refused, done), Enter tickets given up while queued,
// and time passing, on a small queue that is often full, so that shedding
// often takes a principal's own waiter. The invariants hold after every
// step, and once everything is released nothing is in flight or waiting.
func TestMixedClassesProperty(t *testing.T) {
	for seed := range uint64(20) {
		q, clk := newTestQueue(t, Config{
			MaxInFlight:            2,
			MaxTokensInFlight:      300,
			MaxWaiting:             4,
			MaxWaitingPerPrincipal: 3,
			MaxPrincipals:          2,
			AgingInterval:          time.Second,
		})
		rng := rand.New(rand.NewPCG(seed, 3))
		var tickets []*Ticket
		for step := range 2000 {
			switch op := rng.IntN(100); {
			case op < 45:
				r := Request{
					Principal:    string(rune('a' + rng.IntN(4))),
					Class:        Class(rng.IntN(3) - 1),
					PromptTokens: rng.IntN(200),
				}
				var tk *Ticket
				if rng.IntN(2) == 0 {
					tk, _, _ = q.Enter(r, func(error) {})
				} else {
					tk, _ = q.push(r)
				}
				if tk != nil {
					tickets = append(tickets, tk)
				}
			case op < 70 && len(tickets) > 0:
				i := rng.IntN(len(tickets))
				tickets[i].Done()
				if rng.IntN(3) == 0 {
					tickets[i].Done()
				}
				tickets[i] = tickets[len(tickets)-1]
				tickets = tickets[:len(tickets)-1]
			case op < 80 && len(tickets) > 0:
				tickets[rng.IntN(len(tickets))].Charge(rng.IntN(100))
			case op < 88 && len(tickets) > 0:
				// The context of an Admit that had to wait ends: its
				// ticket is still queued, admitted meanwhile, or refused.
				i := rng.IntN(len(tickets))
				if tk := tickets[i]; tk.ready != nil {
					cause := context.Canceled
					if rng.IntN(2) == 0 {
						cause = context.DeadlineExceeded
					}
					if err := q.abandon(tk, cause); err == nil {
						t.Fatal("abandon returned no error")
					}
					tickets[i] = tickets[len(tickets)-1]
					tickets = tickets[:len(tickets)-1]
				}
			case op < 92:
				ctx, cancel := context.WithCancel(context.Background())
				cancel()
				if _, err := q.Admit(ctx, Request{Principal: string(rune('a' + rng.IntN(4)))}); err == nil {
					t.Fatal("Admit with a cancelled context admitted")
				}
			default:
				clk.Advance(time.Duration(rng.IntN(1500)) * time.Millisecond)
			}
			if err := q.check(); err != nil {
				t.Fatalf("seed %d step %d: %v", seed, step, err)
			}
		}
		for _, tk := range tickets {
			tk.Done()
		}
		if s := q.Stats(); s.InFlight != 0 || s.Waiting != 0 || s.TokensInFlight != 0 || s.Principals > 2 {
			t.Fatalf("seed %d: %+v after every release, want nothing in flight or waiting", seed, s)
		}
		mustCheck(t, q)
	}
}
