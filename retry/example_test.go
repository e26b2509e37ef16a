package retry_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/retry"
)

// backend is a replica reachable over HTTP.
type backend struct{ name, url string }

func (b backend) Key() string { return b.name }

// Example wires a Loop, a budget and a Balancer into an http.Client call:
// the first replica answers 503, the retry goes to the other one.
func Example() {
	overloaded := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Retry-After", "0")
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer overloaded.Close()
	healthy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "Hello from the healthy replica")
	}))
	defer healthy.Close()
	transport := &http.Transport{}
	defer transport.CloseIdleConnections()
	client := &http.Client{Transport: transport}

	b, _ := llmlb.New(llmlb.RoundRobin(), llmlb.WithRand(rand.NewPCG(1, 2)))
	_ = b.Update([]llmlb.Endpoint{backend{"replica-a", overloaded.URL}, backend{"replica-b", healthy.URL}})
	budget, _ := retry.NewPercentBudget(retry.DefaultPercentConfig()) // 20% of requests + 10/s
	backoff, _ := retry.NewFullJitter(retry.BackoffConfig{Base: time.Millisecond, Rand: rand.NewPCG(3, 4)})
	ejector, _ := retry.NewEjector(b, retry.EjectorConfig{})
	loop, _ := retry.NewLoop(b, retry.LoopConfig{Budget: budget, Backoff: backoff, Reporter: ejector})

	err := loop.Do(context.Background(), &llmlb.Request{PromptTokens: 12}, func(ctx context.Context, a *retry.Attempt) error {
		be := a.Endpoint().(backend)
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, be.url+"/v1/completions", strings.NewReader(`{"prompt":"Hi"}`))
		if err != nil {
			return err
		}
		resp, err := client.Do(req)
		if err != nil {
			return err // a transport failure: retried elsewhere
		}
		defer resp.Body.Close()
		fmt.Printf("attempt %d on %s: %d\n", a.Number(), be.name, resp.StatusCode)
		if resp.StatusCode != http.StatusOK {
			return &retry.StatusError{Code: resp.StatusCode, Header: resp.Header}
		}
		if !a.FirstToken() { // the commitment point: from here on, no retry
			return nil
		}
		body, err := io.ReadAll(resp.Body)
		fmt.Printf("streamed: %s\n", body)
		return err
	})
	fmt.Println("error:", err)
	// Output:
	// attempt 1 on replica-a: 503
	// attempt 2 on replica-b: 200
	// streamed: Hello from the healthy replica
	// error: <nil>
}

// ExampleAdmission shows a gateway's fail-fast cap: the refused request gets
// a 429 with a Retry-After instead of waiting in a queue.
func ExampleAdmission() {
	adm, _ := retry.NewAdmission(retry.AdmissionConfig{MaxInFlight: 100, MaxPerSession: 1})
	release, err := adm.Acquire("agent-7")
	fmt.Println("first:", err)
	_, err = adm.Acquire("agent-7") // the same session fans out again
	var oe *retry.OverloadError
	if errors.As(err, &oe) {
		fmt.Printf("second: 429, Retry-After: %.0f\n", oe.RetryAfter.Seconds())
	}
	release()
	// Output:
	// first: <nil>
	// second: 429, Retry-After: 1
}

func ExampleFromHeader() {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	for _, h := range []http.Header{
		{"Retry-After": {"120"}},
		{"Retry-After": {"Mon, 30 Nov 2026 12:00:30 GMT"}},
		{"Retry-After": {"3600"}}, // above the 300 s cap: ignored
		{"Grpc-Retry-Pushback-Ms": {"-1"}},
		{"X-Ratelimit-Reset-Tokens": {"6s"}, "X-Ratelimit-Remaining-Tokens": {"0"}},
	} {
		p := retry.FromHeader(h, now, 0)
		fmt.Println(p.Kind, p.Delay)
	}
	// Output:
	// retry-later 2m0s
	// retry-later 30s
	// none 0s
	// do-not-retry 0s
	// retry-later 6s
}

// frozen is a clock that does not move, so the examples' budgets never
// expire what they count.
type frozen struct{}

func (frozen) Now() time.Time { return time.Unix(1_700_000_000, 0) }

// A PercentBudget (Finagle's) lets retries be at most a share of the
// requests of the last TTL, plus a small reserve: 100 requests that all
// fail earn 20 retries, and the reserve of MinRetriesPerSec*TTL is off
// here. Give it to LoopConfig.Budget.
func ExamplePercentBudget() {
	budget, err := retry.NewPercentBudget(retry.PercentConfig{TTL: 10 * time.Second, PercentCanRetry: 0.2, Clock: frozen{}})
	if err != nil {
		panic(err)
	}
	retries := 0
	for range 100 {
		budget.Start() // a request's first attempt
		if budget.Withdraw() {
			retries++
			budget.Finish(true, retry.Failed)
		}
		budget.Finish(false, retry.Failed)
	}
	fmt.Println("retries granted:", retries)
	// Output: retries granted: 20
}

// A Throttle is gRPC's retryThrottling: failures drain a token bucket and
// successes refill it slowly; below half full, no retries.
func ExampleThrottle() {
	throttle, err := retry.NewThrottle(retry.DefaultThrottleConfig()) // 10 tokens, 0.1 per success
	if err != nil {
		panic(err)
	}
	for i := 1; i <= 6; i++ {
		throttle.Finish(false, retry.Failed) // an attempt failed
		fmt.Printf("after %d failures: %.0f tokens, retries allowed: %v\n", i, throttle.Tokens(), throttle.Withdraw())
	}
	for range 10 {
		throttle.Finish(false, retry.Succeeded)
	}
	fmt.Printf("after 10 successes: %.0f tokens, retries allowed: %v\n", throttle.Tokens(), throttle.Withdraw())
	// Output:
	// after 1 failures: 9 tokens, retries allowed: true
	// after 2 failures: 8 tokens, retries allowed: true
	// after 3 failures: 7 tokens, retries allowed: true
	// after 4 failures: 6 tokens, retries allowed: true
	// after 5 failures: 5 tokens, retries allowed: false
	// after 6 failures: 4 tokens, retries allowed: false
	// after 10 successes: 5 tokens, retries allowed: false
}

// A ConcurrentBudget (Envoy's) bounds the retries in flight at once rather
// than over time: here at most max(3, 20% of the attempts in flight).
func ExampleConcurrentBudget() {
	budget, err := retry.NewConcurrentBudget(retry.ConcurrentConfig{BudgetPercent: 20, MinRetryConcurrency: 3})
	if err != nil {
		panic(err)
	}
	for range 10 {
		budget.Start() // ten requests in flight
	}
	granted := 0
	for range 10 {
		if budget.Withdraw() {
			granted++
		}
	}
	attempts, retries := budget.Active()
	fmt.Printf("%d retries granted; in flight: %d attempts, %d retries\n", granted, attempts, retries)
	// Output: 3 retries granted; in flight: 13 attempts, 3 retries
}
