package fair

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Under concurrent random admissions, charges, releases, cancellations and
// deadlines, every Admit returns exactly once (no waiter is lost), no ticket
// is handed out twice, the invariants hold throughout, and once everything is
// released the queue is empty.
func TestConcurrentRandomOperations(t *testing.T) {
	q, err := New(Config{
		MaxInFlight:            4,
		MaxTokensInFlight:      400,
		MaxWaiting:             64,
		MaxWaitingPerPrincipal: 20,
		MaxPrincipals:          8,
		AgingInterval:          2 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	const workers, perWorker = 16, 300
	var (
		wg                  sync.WaitGroup
		issued              sync.Map // *Ticket -> struct{}
		admitted, refused   atomic.Int64
		duplicate, negative atomic.Bool
	)
	stop := make(chan struct{})
	checkerDone := make(chan struct{})
	go func() {
		defer close(checkerDone)
		for {
			select {
			case <-stop:
				return
			default:
			}
			if err := q.check(); err != nil {
				t.Error(err)
				return
			}
			time.Sleep(100 * time.Microsecond)
		}
	}()
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			for range perWorker {
				ctx, cancel := context.Background(), context.CancelFunc(func() {})
				switch rng.IntN(4) {
				case 0:
					ctx, cancel = context.WithTimeout(ctx, time.Duration(rng.IntN(500))*time.Microsecond)
				case 1:
					ctx, cancel = context.WithCancel(ctx)
					if rng.IntN(2) == 0 {
						time.AfterFunc(time.Duration(rng.IntN(300))*time.Microsecond, cancel)
					}
				}
				r := Request{
					Principal:    string(rune('a' + rng.IntN(12))),
					Class:        Class(rng.IntN(3) - 1),
					PromptTokens: rng.IntN(150) - 10,
				}
				tk, err := q.Admit(ctx, r)
				if err != nil {
					refused.Add(1)
					cancel()
					continue
				}
				admitted.Add(1)
				if _, dup := issued.LoadOrStore(tk, struct{}{}); dup {
					duplicate.Store(true)
				}
				for range rng.IntN(4) {
					tk.Charge(rng.IntN(20))
					time.Sleep(time.Duration(rng.IntN(50)) * time.Microsecond)
				}
				if c, _ := q.counter(r.Principal); c < 0 {
					negative.Store(true)
				}
				tk.Done()
				if rng.IntN(4) == 0 {
					tk.Done()
				}
				cancel()
			}
		}()
	}
	wg.Wait()
	close(stop)
	<-checkerDone
	if duplicate.Load() {
		t.Error("a ticket was handed out twice")
	}
	if negative.Load() {
		t.Error("a counter went negative")
	}
	if n := admitted.Load() + refused.Load(); n != workers*perWorker {
		t.Errorf("%d outcomes for %d requests", n, workers*perWorker)
	}
	if s := q.Stats(); s.InFlight != 0 || s.Waiting != 0 || s.TokensInFlight != 0 || s.Principals > 8 {
		t.Errorf("not empty after every release: %+v", s)
	}
	mustCheck(t, q)
	t.Logf("%d admitted, %d refused", admitted.Load(), refused.Load())
}
