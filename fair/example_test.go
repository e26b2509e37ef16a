package fair_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/llmlb/llmlb/fair"
	"github.com/llmlb/llmlb/retry"
)

// A request's life: admission with its principal, class and prompt, output
// charged as it streams, and Done when it ends.
func Example() {
	q, err := fair.New(fair.Config{
		MaxInFlight:       64,
		MaxTokensInFlight: 256_000,
		Weight: func(tenant string) float64 {
			if tenant == "premium" {
				return 2 // twice the share of a tenant of weight 1
			}
			return 1
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	tk, err := q.Admit(context.Background(), fair.Request{Principal: "premium", Class: fair.Interactive, PromptTokens: 1200})
	if err != nil {
		log.Fatal(err) // a *retry.OverloadError: answer 429 with its RetryAfter
	}
	for range 3 { // three streamed chunks of 16 tokens
		tk.Charge(16)
	}
	fmt.Printf("%+v\n", q.Stats())
	tk.Done()
	fmt.Printf("%+v\n", q.Stats())
	// Output:
	// {InFlight:1 TokensInFlight:1248 Waiting:0 Principals:1}
	// {InFlight:0 TokensInFlight:0 Waiting:0 Principals:1}
}

// A request that cannot be admitted in time fails fast with a refusal that
// a gateway turns into 429 Too Many Requests with a Retry-After header.
func Example_overload() {
	q, err := fair.New(fair.Config{MaxInFlight: 1})
	if err != nil {
		log.Fatal(err)
	}
	running, _ := q.Admit(context.Background(), fair.Request{Principal: "t1"})
	defer running.Done()

	// The capacity is in use and the caller's deadline has passed.
	ctx, cancel := context.WithDeadline(context.Background(), time.Now())
	defer cancel()
	_, err = q.Admit(ctx, fair.Request{Principal: "t2"})
	var oe *retry.OverloadError
	fmt.Println(errors.As(err, &oe), oe.RetryAfter, errors.Is(err, context.DeadlineExceeded))
	// Output:
	// true 1s true
}

// An event loop that cannot block enters requests with Enter and starts a
// queued one when its ready function is called.
func ExampleQueue_Enter() {
	q, err := fair.New(fair.Config{MaxInFlight: 1})
	if err != nil {
		panic(err)
	}
	first, admitted, _ := q.Enter(fair.Request{Principal: "alice"}, func(error) {})
	fmt.Println("alice admitted:", admitted)
	second, admitted, _ := q.Enter(fair.Request{Principal: "bob"}, func(err error) {
		fmt.Println("bob admitted later, refused:", err != nil)
	})
	fmt.Println("bob admitted:", admitted)
	first.Charge(20)
	first.Done() // calls bob's ready function
	second.Done()
	// Output:
	// alice admitted: true
	// bob admitted: false
	// bob admitted later, refused: false
}
