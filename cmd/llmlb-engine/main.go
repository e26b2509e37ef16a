// Command llmlb-engine runs emulated LLM inference servers on loopback: each
// speaks the OpenAI-compatible completions API (streaming and not) and
// exposes vLLM-named /metrics, driven in real time by the simulator's
// continuous-batching model with a prefix cache.
//
//	go run ./cmd/llmlb-engine -n 4 -speedup 10
//	go run ./cmd/llmlb-engine -ports 8001,8002,8003,8004
//
// As vLLM's server, each closes a keep-alive connection that has carried no
// request for 5 seconds (-idle-timeout): a client that keeps connections
// idle longer, as net/http's DefaultTransport does (90 seconds), sees the
// occasional request fail with EOF or a connection reset when it is sent
// just as the connection closes, as it would against vLLM.
//
// It binds every port first, HTTP and KV events, then prints one base URL
// per engine and runs until SIGTERM or SIGINT; if a port cannot be bound,
// it prints no URL, only the error, and exits 1. -h lists the flags.
//
// On SIGTERM or SIGINT it stops as vLLM's server does with its
// --shutdown-timeout (vLLM v0.18.0 and later): by default (0) at once, its
// streams in progress breaking, as vLLM aborts its requests in progress by
// default; with -shutdown-timeout D, each engine drains first: it answers
// new requests with 503 (and GET /health with 503, as SGLang's does while
// it drains; GET /metrics still answers) and lets its requests in progress
// finish for up to D, then stops, and the command exits 0 once every engine
// has. A second signal ends the command at once.
//
//	go run ./cmd/llmlb-engine -n 2 -shutdown-timeout 30s
//
// With -kv-events-port N, engine i also publishes its KV-cache events as
// vLLM does with --kv-events-config (publisher zmq, topic "kv-events"): on a
// ZMQ PUB socket at port N+i of -host, with a replay socket at port
// N+i+1000 (so at most 1000 engines), in vLLM's wire format, so that any
// consumer of vLLM's stream (package kvevents among them) can follow it.
// The token IDs of the events are those of engine.Tokens: one per 4 bytes
// of prompt text.
//
//	go run ./cmd/llmlb-engine -n 2 -kv-events-port 5557
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/llmlb/llmlb/engine"
	"github.com/llmlb/llmlb/kvevents"
)

func main() {
	ctx, stop := signalContext()
	code := status(run(ctx, os.Args[1:], os.Stdout, os.Stderr), os.Stderr)
	stop()
	os.Exit(code)
}

// signalContext returns a context that ends at the first SIGTERM or SIGINT.
// Its handler goes before the context ends, so that a second signal, during
// the drain, ends the process at once.
func signalContext() (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	go func() {
		select {
		case <-sigs:
		case <-ctx.Done():
		}
		signal.Stop(sigs)
		cancel()
	}()
	return ctx, cancel
}

// status returns the exit status for run's error, which it writes to
// stderr: 0 for none, for the end of a signal, and for -h or -help
// (whose usage run wrote); 1 otherwise.
func status(err error, stderr io.Writer) int {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, flag.ErrHelp) {
		return 0
	}
	fmt.Fprintln(stderr, "llmlb-engine:", err)
	return 1
}

// maxEngines bounds -n: each engine is a listener and a scheduling
// goroutine on this machine.
const maxEngines = 1024

// maxKVEngines bounds the engines that publish KV events: engine i's
// replay socket is on the port 1000 above its PUB socket's, engine
// i+1000's.
const maxKVEngines = 1000

// vllmIdleTimeout is the default -idle-timeout: how long vLLM's API server
// keeps an idle keep-alive connection, uvicorn's timeout_keep_alive, which
// vLLM sets to VLLM_HTTP_TIMEOUT_KEEP_ALIVE, "5" seconds unless set
// (vllm/envs.py; serve_http's call in vllm/entrypoints/openai/api_server.py,
// vLLM main as of 2026).
const vllmIdleTimeout = 5 * time.Second

// minSpeedup is the smallest -speedup, engine.Config's bound.
const minSpeedup = 1e-3

// parsePorts parses the value of -ports: comma-separated ports, at most
// maxEngines, none twice but 0 (a free port). It returns their addresses on
// host, each port written as a number ("08001" as 8001, "00" as 0).
func parsePorts(list, host string) ([]string, error) {
	var addrs []string
	var seen []uint64
	for _, p := range strings.Split(list, ",") {
		p = strings.TrimSpace(p)
		n, err := strconv.ParseUint(p, 10, 16)
		switch {
		case err != nil:
			return nil, fmt.Errorf("-ports %q: %q is not a port from 0 to 65535", list, p)
		case n != 0 && slices.Contains(seen, n):
			return nil, fmt.Errorf("-ports %q lists %d twice", list, n)
		case len(addrs) == maxEngines:
			return nil, fmt.Errorf("-ports %q lists more than %d ports", list, maxEngines)
		}
		seen = append(seen, n)
		addrs = append(addrs, net.JoinHostPort(host, strconv.FormatUint(n, 10)))
	}
	return addrs, nil
}

// run runs the engines until ctx ends, printing their addresses to out once
// every engine's ports are bound; the flag package writes its usage and
// parse errors to stderr.
func run(ctx context.Context, args []string, out, stderr io.Writer) error {
	fs := flag.NewFlagSet("llmlb-engine", flag.ContinueOnError)
	fs.SetOutput(stderr)
	n := fs.Int("n", 1, "number of engines, on free ports (ignored with -ports)")
	ports := fs.String("ports", "", "comma-separated ports to listen on, one engine each")
	host := fs.String("host", "127.0.0.1", "address to bind")
	speedup := fs.Float64("speedup", 1, "run the iteration-time model this many times faster than real time")
	model := fs.String("model", engine.DefaultModel, "model name served")
	maxTokens := fs.Int("max-tokens", engine.DefaultMaxTokens, "output tokens of a chat or responses request without a length (a completion without max_tokens gets 16, as in vLLM)")
	kvBlocks := fs.Int("kv-blocks", engine.DefaultKVBlocks, "KV-cache capacity in blocks")
	blockSize := fs.Int("block-size", engine.DefaultBlockSize, "tokens per KV block")
	budget := fs.Int("token-budget", engine.DefaultTokenBudget, "tokens per iteration (chunked prefill)")
	maxRunning := fs.Int("max-running", engine.DefaultMaxRunning, "maximum sequences in the running batch")
	maxWaiting := fs.Int("max-waiting", 0, "answer 429 when this many requests wait (0: no cap)")
	rpm := fs.Int("rpm", 0, "emulate a managed API's rate limit: requests per minute, with OpenAI's x-ratelimit headers and 429 + Retry-After past it (0: none)")
	maxModelLen := fs.Int("max-model-len", 0, "context length: a prompt plus max_tokens beyond it gets 400 in vLLM's words, a request without max_tokens generates no more than fits (0: the KV cache's size)")
	readTimeout := fs.Duration("read-timeout", engine.DefaultReadTimeout, "time a client has to send a request's body once its header is in (408 past it); answers, streams among them, are not bounded")
	idleTimeout := fs.Duration("idle-timeout", vllmIdleTimeout, "close a keep-alive connection idle this long, as vLLM's server does after 5s (a client must keep connections idle for less, or retry)")
	shutdownTimeout := fs.Duration("shutdown-timeout", 0, "on SIGTERM or SIGINT, how long each engine lets its requests in progress finish while it answers new ones 503, "+
		"as vLLM's --shutdown-timeout (0: break them at once, vLLM's default)")
	kvPort := fs.Int("kv-events-port", 0, "publish engine i's KV events over ZMQ on this port + i, replay on this port + i + 1000 (0: off)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q (llmlb-engine -h lists the flags)", fs.Arg(0))
	}
	// Sizes are positive: 0, which engine.Config reads as its default,
	// would silently run something other than what was asked.
	for _, f := range []struct {
		name  string
		value int
	}{
		{"max-tokens", *maxTokens}, {"kv-blocks", *kvBlocks}, {"block-size", *blockSize},
		{"token-budget", *budget}, {"max-running", *maxRunning},
	} {
		if f.value < 1 {
			return fmt.Errorf("-%s %d must be positive", f.name, f.value)
		}
	}
	for _, f := range []struct {
		name  string
		value int
	}{
		{"max-waiting", *maxWaiting}, {"rpm", *rpm}, {"max-model-len", *maxModelLen}, {"kv-events-port", *kvPort},
	} {
		if f.value < 0 {
			return fmt.Errorf("-%s %d must not be negative", f.name, f.value)
		}
	}
	// 0 would be engine.Config's default, not what was asked.
	if *readTimeout <= 0 {
		return fmt.Errorf("-read-timeout %v must be positive", *readTimeout)
	}
	if *idleTimeout <= 0 {
		return fmt.Errorf("-idle-timeout %v must be positive", *idleTimeout)
	}
	if *shutdownTimeout < 0 {
		return fmt.Errorf("-shutdown-timeout %v must not be negative", *shutdownTimeout)
	}
	// "" would be engine.Config's default model, not what was asked.
	if *model == "" {
		return errors.New("-model must not be empty")
	}
	if *maxTokens > engine.DefaultMaxTokensCap {
		return fmt.Errorf("-max-tokens %d exceeds the output cap of %d tokens", *maxTokens, engine.DefaultMaxTokensCap)
	}
	if !(*speedup >= minSpeedup) || math.IsInf(*speedup, 0) {
		return fmt.Errorf("-speedup %v must be finite and at least %g", *speedup, minSpeedup)
	}
	var addrs []string
	if *ports != "" {
		var err error
		if addrs, err = parsePorts(*ports, *host); err != nil {
			return err
		}
	} else {
		if *n < 1 || *n > maxEngines {
			return fmt.Errorf("-n %d out of range [1, %d]", *n, maxEngines)
		}
		for range *n {
			addrs = append(addrs, net.JoinHostPort(*host, "0"))
		}
	}
	cfg := engine.Config{
		TokenBudget:       *budget,
		MaxRunning:        *maxRunning,
		KVBlocks:          *kvBlocks,
		BlockSize:         *blockSize,
		Speedup:           *speedup,
		Model:             *model,
		DefaultMaxTokens:  *maxTokens,
		MaxWaiting:        *maxWaiting,
		RequestsPerMinute: *rpm,
		MaxModelLen:       *maxModelLen,
		ReadTimeout:       *readTimeout,
		IdleTimeout:       *idleTimeout,
		ShutdownTimeout:   *shutdownTimeout,
	}
	if *kvPort < 0 || *kvPort > 0 && *kvPort+len(addrs)-1+1000 > 65535 {
		return fmt.Errorf("-kv-events-port %d out of range for %d engines", *kvPort, len(addrs))
	}
	// Engine i's replay port, N+i+1000, would be engine i+1000's PUB port.
	if *kvPort > 0 && len(addrs) > maxKVEngines {
		return fmt.Errorf("-kv-events-port: %d engines publish KV events, at most %d can", len(addrs), maxKVEngines)
	}
	// Every port is bound before any address is printed, so that a script
	// waiting for them sees either all of them or an error.
	ls, err := listen(addrs, *host, *kvPort)
	if err != nil {
		return err
	}
	defer ls.close()
	engines := make([]*engine.Engine, len(addrs))
	pubs := make([]*kvevents.Publisher, len(addrs))
	for i := range addrs {
		cfg := cfg
		if *kvPort > 0 {
			pub, err := kvevents.NewPublisher(kvevents.PublisherConfig{
				Endpoint:       ls.pub[i],
				ReplayEndpoint: ls.replay[i],
				Topic:          "kv-events",
			})
			if err != nil {
				return err
			}
			cfg.KVEvents = pub.Publish
			pubs[i] = pub
		}
		if engines[i], err = engine.New(cfg); err != nil {
			return err
		}
	}
	for i, l := range ls.http {
		if *kvPort > 0 {
			fmt.Fprintf(out, "http://%s kv-events tcp://%s replay tcp://%s\n", l.Addr(),
				net.JoinHostPort(*host, strconv.Itoa(*kvPort+i)), net.JoinHostPort(*host, strconv.Itoa(*kvPort+i+1000)))
		} else {
			fmt.Fprintf(out, "http://%s\n", l.Addr())
		}
	}
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	var wg sync.WaitGroup
	errs := make(chan error, 2*len(addrs))
	for i, e := range engines {
		if pub := pubs[i]; pub != nil {
			wg.Go(func() {
				if err := pub.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
					errs <- err
					stop()
				}
			})
		}
		l := ls.http[i]
		ls.http[i] = nil // Serve closes it
		wg.Go(func() {
			if err := e.Serve(ctx, l); err != nil && !errors.Is(err, context.Canceled) {
				errs <- err
				stop()
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs
}
