// Command llmlb-engine runs emulated LLM inference servers on loopback: each
// speaks the OpenAI-compatible completions API (streaming and not) and
// exposes vLLM-named /metrics, driven in real time by the simulator's
// continuous-batching model with a prefix cache.
//
//	go run ./cmd/llmlb-engine -n 4 -speedup 10
//	go run ./cmd/llmlb-engine -ports 8001,8002,8003,8004
//
// It prints one base URL per engine and runs until interrupted.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"

	"github.com/llmlb/llmlb/engine"
	"github.com/llmlb/llmlb/sim"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "llmlb-engine:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("llmlb-engine", flag.ContinueOnError)
	n := fs.Int("n", 1, "number of engines, on free ports (ignored with -ports)")
	ports := fs.String("ports", "", "comma-separated ports to listen on, one engine each")
	host := fs.String("host", "127.0.0.1", "address to bind")
	speedup := fs.Float64("speedup", 1, "run the iteration-time model this many times faster than real time")
	model := fs.String("model", engine.DefaultModel, "model name served")
	maxTokens := fs.Int("max-tokens", engine.DefaultMaxTokens, "output tokens of a request without max_tokens")
	kvBlocks := fs.Int("kv-blocks", sim.DefaultKVBlocks, "KV-cache capacity in blocks")
	blockSize := fs.Int("block-size", sim.DefaultBlockSize, "tokens per KV block")
	budget := fs.Int("token-budget", sim.DefaultTokenBudget, "tokens per iteration (chunked prefill)")
	maxRunning := fs.Int("max-running", sim.DefaultMaxRunning, "maximum sequences in the running batch")
	maxWaiting := fs.Int("max-waiting", 0, "answer 429 when this many requests wait (0: no cap)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var addrs []string
	if *ports != "" {
		for _, p := range strings.Split(*ports, ",") {
			if _, err := strconv.ParseUint(strings.TrimSpace(p), 10, 16); err != nil {
				return fmt.Errorf("bad port %q", p)
			}
			addrs = append(addrs, net.JoinHostPort(*host, strings.TrimSpace(p)))
		}
	} else {
		if *n < 1 {
			return errors.New("-n must be at least 1")
		}
		for range *n {
			addrs = append(addrs, net.JoinHostPort(*host, "0"))
		}
	}
	cfg := engine.Config{
		Engine: sim.Engine{
			TokenBudget: *budget,
			MaxRunning:  *maxRunning,
			KVBlocks:    *kvBlocks,
			BlockSize:   *blockSize,
		},
		Speedup:          *speedup,
		Model:            *model,
		DefaultMaxTokens: *maxTokens,
		MaxWaiting:       *maxWaiting,
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	var wg sync.WaitGroup
	errs := make(chan error, len(addrs))
	for _, addr := range addrs {
		e, err := engine.New(cfg)
		if err != nil {
			return err
		}
		l, err := net.Listen("tcp", addr)
		if err != nil {
			stop()
			wg.Wait()
			return err
		}
		fmt.Printf("http://%s\n", l.Addr())
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
