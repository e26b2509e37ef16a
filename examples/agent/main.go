// Command agent shows llmlb inside an agent's own HTTP client, with no
// gateway: an agent loop of sequential calls in one session, then a fan-out
// of 10 child calls that share the conversation as their prefix, against 4
// emulated engines started in-process.
//
//	go run ./examples/agent
//
// The client's http.Transport is an httplb.Transport over a Balancer with
// the default policy: the session's growing prompt keeps it on the replica
// that caches it (prefix affinity, with the session header as affinity key),
// a per-session admission cap keeps the fan-out from burying one replica
// (children beyond it are refused with a Retry-After and sent again after
// it), and the replica the session was on is killed before the fan-out, so
// the children sent there are retried on another one before their first
// token.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/engine"
	"github.com/llmlb/llmlb/httplb"
	"github.com/llmlb/llmlb/retry"
	"github.com/llmlb/llmlb/signals"
)

const session = "agent-1"

func main() {
	if err := run(os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "agent:", err)
		os.Exit(1)
	}
}

// attempts records which replica every attempt went to.
type attempts struct {
	base http.RoundTripper
	mu   sync.Mutex
	log  []string
}

func (a *attempts) RoundTrip(r *http.Request) (*http.Response, error) {
	a.mu.Lock()
	a.log = append(a.log, "http://"+r.URL.Host)
	a.mu.Unlock()
	return a.base.RoundTrip(r)
}

func (a *attempts) since(n int) []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.log[n:])
}

func (a *attempts) len() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.log)
}

// run runs the agent loop and the fan-out, printing what happened to out.
// It fails if a call fails, a child's included, or if the balancer or the
// admission still count a request once every call has ended.
func run(out io.Writer) error {
	cluster, err := startCluster(4, engine.Config{Speedup: 10})
	if err != nil {
		return err
	}
	defer cluster.close()
	names := map[string]string{}
	for i, u := range cluster.urls {
		names[u] = fmt.Sprintf("engine-%d", i)
	}

	scraper, err := signals.NewScraper(signals.Config{Interval: 100 * time.Millisecond})
	if err != nil {
		return err
	}
	targets := map[string]string{}
	for _, u := range cluster.urls {
		targets[u] = u + "/metrics"
	}
	if err := scraper.SetTargets(targets); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	scraped := make(chan struct{})
	go func() {
		defer close(scraped)
		_ = scraper.Run(ctx)
	}()
	defer func() { cancel(); <-scraped }()

	policy, err := llmlb.Default(llmlb.DefaultConfig{})
	if err != nil {
		return err
	}
	b, err := llmlb.New(policy, llmlb.WithSignal(scraper, time.Second))
	if err != nil {
		return err
	}
	eps, err := httplb.NewEndpoints(cluster.urls...)
	if err != nil {
		return err
	}
	if err := b.Update(eps); err != nil {
		return err
	}
	adm, err := retry.NewAdmission(retry.AdmissionConfig{MaxPerSession: 4, RetryAfter: 20 * time.Millisecond})
	if err != nil {
		return err
	}
	log := &attempts{base: &http.Transport{MaxIdleConnsPerHost: 64}}
	tr, err := httplb.NewTransport(httplb.Config{Balancer: b, Base: log, Admission: adm, Retry: retry.LoopConfig{MaxAttempts: 3}})
	if err != nil {
		return err
	}
	defer log.base.(*http.Transport).CloseIdleConnections()
	client := &http.Client{Transport: tr}

	// The agent loop: each turn appends the model's answer and a tool
	// result to the conversation, so every prompt extends the previous one.
	messages := []message{{"system", strings.Repeat("You are a careful planning agent with tools. ", 40)}}
	messages = append(messages, message{"user", "Plan the migration of the billing service."})
	fmt.Fprintln(out, "agent loop, session", session)
	var last string
	for turn := 1; turn <= 6; turn++ {
		n := log.len()
		r, err := call(ctx, client, messages, 24)
		if err != nil {
			return fmt.Errorf("turn %d: %w", turn, err)
		}
		last = log.since(n)[0]
		fmt.Fprintf(out, "  turn %d: %-8s ttft %-6v %d tokens, prompt %d bytes\n", turn, names[last], r.ttft.Round(time.Millisecond), r.tokens, promptBytes(messages))
		messages = append(messages,
			message{"assistant", r.text},
			message{"user", fmt.Sprintf("Tool result %d: %s", turn, strings.Repeat("row ", 60))})
	}

	// Fan-out: 10 children share the conversation and differ in their last
	// message. The session's replica is killed first.
	cluster.kill(slices.Index(cluster.urls, last))
	fmt.Fprintf(out, "\nkilled %s (the session's replica); fan-out of 10 children, at most 4 in flight per session\n", names[last])
	n := log.len()
	var wg sync.WaitGroup
	var mu sync.Mutex
	refused, failures := 0, 0
	results := make([]string, 10)
	for child := range 10 {
		wg.Go(func() {
			msgs := append(slices.Clip(messages), message{"user", fmt.Sprintf("Sub-task %d: check shard %d.", child, child)})
			for {
				r, err := call(ctx, client, msgs, 16)
				var oe *retry.OverloadError
				if errors.As(err, &oe) {
					mu.Lock()
					refused++
					mu.Unlock()
					time.Sleep(oe.RetryAfter)
					continue
				}
				if err != nil {
					results[child] = "error: " + err.Error()
					mu.Lock()
					failures++
					mu.Unlock()
					return
				}
				results[child] = fmt.Sprintf("%d tokens, ttft %v", r.tokens, r.ttft.Round(time.Millisecond))
				return
			}
		})
	}
	wg.Wait()
	for i, r := range results {
		fmt.Fprintf(out, "  child %d: %s\n", i, r)
	}
	per := map[string]int{}
	failed := 0
	for _, u := range log.since(n) {
		per[names[u]]++
		if u == last {
			failed++
		}
	}
	fmt.Fprintf(out, "\nfan-out attempts per replica: %v\n", per)
	fmt.Fprintf(out, "refused by the per-session cap and sent again: %d\n", refused)
	fmt.Fprintf(out, "attempts on the killed replica, retried elsewhere before the first token: %d\n", failed)
	idle := true
	for _, s := range b.Stats() {
		idle = idle && s.Outstanding == 0
	}
	fmt.Fprintf(out, "balancer idle after the run: %v, sessions in flight: %d\n", idle, adm.Sessions())
	switch {
	case failures > 0:
		return fmt.Errorf("fan-out: %d of %d children failed", failures, len(results))
	case !idle || adm.Sessions() != 0:
		return errors.New("a request is still counted after every call ended")
	}
	return nil
}

// cluster is a set of emulated engines on loopback, each of which can be
// killed on its own.
type cluster struct {
	urls  []string
	stops []func()
}

// startCluster starts n engines configured by cfg on free loopback ports.
func startCluster(n int, cfg engine.Config) (*cluster, error) {
	c := &cluster{}
	for range n {
		e, err := engine.New(cfg)
		if err != nil {
			c.close()
			return nil, err
		}
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			c.close()
			return nil, err
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			defer close(done)
			_ = e.Serve(ctx, l)
		}()
		c.urls = append(c.urls, "http://"+l.Addr().String())
		c.stops = append(c.stops, sync.OnceFunc(func() { cancel(); <-done }))
	}
	return c, nil
}

// kill stops engine i at once, as a crashed server stops: its listener and
// connections close and streams in progress break.
func (c *cluster) kill(i int) { c.stops[i]() }

// close stops every engine still running.
func (c *cluster) close() {
	for _, stop := range c.stops {
		stop()
	}
}

type message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

func promptBytes(msgs []message) int {
	n := 0
	for _, m := range msgs {
		n += len(m.Role) + len(m.Content) + 2
	}
	return n
}

type reply struct {
	text   string
	tokens int
	ttft   time.Duration
}

// maxErrorBody is the most of an error response's body that call reads into
// its error.
const maxErrorBody = 1 << 10

// call sends one streamed chat completion in the session and reads it.
func call(ctx context.Context, client *http.Client, msgs []message, maxTokens int) (reply, error) {
	body, err := json.Marshal(map[string]any{"model": "emulated", "messages": msgs, "max_tokens": maxTokens, "stream": true})
	if err != nil {
		return reply{}, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://llm.invalid/v1/chat/completions", strings.NewReader(string(body)))
	if err != nil {
		return reply{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(httplb.DefaultSessionHeader, session)
	start := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		return reply{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		// Only the head of the error: the body is the replica's to size.
		b, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
		return reply{}, fmt.Errorf("status %d: %s", resp.StatusCode, bytes.TrimSpace(b))
	}
	var r reply
	var text strings.Builder
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || data == "[DONE]" {
			continue
		}
		var chunk struct {
			Choices []struct {
				Delta struct{ Content string } `json:"delta"`
			} `json:"choices"`
		}
		// A token is a chunk with content: not the role chunk that
		// opens the stream, whose content is empty.
		if json.Unmarshal([]byte(data), &chunk) != nil || len(chunk.Choices) == 0 || chunk.Choices[0].Delta.Content == "" {
			continue
		}
		if r.tokens == 0 {
			r.ttft = time.Since(start)
		}
		r.tokens++
		text.WriteString(chunk.Choices[0].Delta.Content)
	}
	r.text = text.String()
	return r, sc.Err()
}
