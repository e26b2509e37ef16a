// Command grpc routes streaming gRPC calls across three in-process replicas
// with the llmlb grpc-go balancer and prints how many calls each replica
// received under each policy:
//
//	go run ./examples/grpc
//	go run ./examples/grpc -calls 1000 -policies round-robin,p2c,least-kv,default
//
// The replicas are gRPC servers on loopback that stream a few messages per
// call, like a model server streaming tokens, and attach an ORCA load report
// to every response (orca.CallMetricsServerOption). One of them reports a
// nearly full KV cache (kv_cache_utilization 0.95), the others 0.2. The
// client dials them through a manual resolver with the balancer selected by
// the service config, tells the balancer each call's prompt length with a
// grpclb.Call, and reports the first streamed message with Call.FirstToken.
// Load-blind policies split the calls evenly; KV-aware ones (least-kv,
// default, p2c with "score": "kv") keep traffic off the full replica.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/orca"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/grpclb"
)

// replica is a TestService that streams tokens and reports its KV usage.
type replica struct {
	testgrpc.UnimplementedTestServiceServer
	addr   string
	kv     float64
	tokens int
	delay  time.Duration
	calls  atomic.Int64
}

func (r *replica) StreamingOutputCall(_ *testgrpc.StreamingOutputCallRequest, stream grpc.ServerStreamingServer[testgrpc.StreamingOutputCallResponse]) error {
	r.calls.Add(1)
	if rec := orca.CallMetricsRecorderFromContext(stream.Context()); rec != nil {
		rec.SetNamedMetric("kv_cache_utilization", r.kv)
	}
	for range r.tokens {
		time.Sleep(r.delay)
		if err := stream.Send(&testgrpc.StreamingOutputCallResponse{}); err != nil {
			return err
		}
	}
	return nil
}

func main() {
	calls := flag.Int("calls", 300, "calls per policy")
	concurrency := flag.Int("concurrency", 8, "concurrent calls")
	policies := flag.String("policies", "round-robin,p2c-kv,least-kv,default",
		"comma-separated policies; p2c-kv is p2c with the KV score. Known: "+strings.Join(grpclb.Policies(), ", "))
	flag.Parse()
	if flag.NArg() > 0 {
		log.Fatalf("unexpected argument %q (grpc -h lists the flags)", flag.Arg(0))
	}
	if *calls < 1 || *concurrency < 1 {
		log.Fatal("-calls and -concurrency must be positive")
	}
	names, err := parsePolicies(*policies)
	if err != nil {
		log.Fatal(err)
	}

	// Once, before dialing: make the balancer selectable by service config.
	if _, err := grpclb.Register(grpclb.Options{Name: grpclb.DefaultName}); err != nil {
		log.Fatal(err)
	}

	replicas, stop, err := startReplicas([]float64{0.2, 0.95, 0.2})
	if err != nil {
		log.Fatal(err)
	}
	defer stop()

	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	defer tw.Flush()
	fmt.Fprint(tw, "calls per replica\t")
	for _, r := range replicas {
		fmt.Fprintf(tw, "%s (kv %.2f)\t", r.addr, r.kv)
	}
	fmt.Fprintln(tw)
	for _, name := range names {
		cfg := fmt.Sprintf(`{"policy": %q}`, name)
		if name == "p2c-kv" {
			cfg = `{"policy": "p2c", "score": "kv"}`
		}
		for _, r := range replicas {
			r.calls.Store(0)
		}
		if err := run(cfg, replicas, *calls, *concurrency); err != nil {
			tw.Flush()
			log.Fatalf("policy %s: %v", name, err)
		}
		fmt.Fprintf(tw, "%s\t", name)
		for _, r := range replicas {
			fmt.Fprintf(tw, "%d\t", r.calls.Load())
		}
		fmt.Fprintln(tw)
	}
}

// parsePolicies splits the -policies list, trims the spaces around each name
// and checks every name before any policy runs.
func parsePolicies(list string) ([]string, error) {
	known := append(grpclb.Policies(), "p2c-kv")
	var names []string
	for _, name := range strings.Split(list, ",") {
		name = strings.TrimSpace(name)
		if name == "" {
			continue
		}
		if !slices.Contains(known, name) {
			return nil, fmt.Errorf("-policies: unknown policy %q (known: %s)", name, strings.Join(known, ", "))
		}
		names = append(names, name)
	}
	if len(names) == 0 {
		return nil, errors.New("-policies: no policy given")
	}
	return names, nil
}

// startReplicas starts one replica per KV usage on loopback.
func startReplicas(kvs []float64) ([]*replica, func(), error) {
	var replicas []*replica
	var servers []*grpc.Server
	stop := func() {
		for _, s := range servers {
			s.Stop()
		}
	}
	for _, kv := range kvs {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			stop()
			return nil, nil, err
		}
		r := &replica{addr: lis.Addr().String(), kv: kv, tokens: 4, delay: time.Millisecond}
		srv := grpc.NewServer(orca.CallMetricsServerOption(nil))
		testgrpc.RegisterTestServiceServer(srv, r)
		go srv.Serve(lis)
		servers = append(servers, srv)
		replicas = append(replicas, r)
	}
	return replicas, stop, nil
}

// run dials the replicas with the balancer config cfg and makes calls
// streaming calls, concurrency at a time.
func run(cfg string, replicas []*replica, calls, concurrency int) error {
	var eps []resolver.Endpoint
	for _, r := range replicas {
		eps = append(eps, resolver.Endpoint{Addresses: []resolver.Address{{Addr: r.addr}}})
	}
	res := manual.NewBuilderWithScheme("replicas")
	res.InitialState(resolver.State{Endpoints: eps})
	sc := fmt.Sprintf(`{"loadBalancingConfig": [{%q: %s}]}`, grpclb.DefaultName, cfg)
	cc, err := grpc.NewClient("replicas:///model", grpc.WithResolvers(res),
		grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithDefaultServiceConfig(sc))
	if err != nil {
		return err
	}
	defer cc.Close()
	client := testgrpc.NewTestServiceClient(cc)

	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, concurrency)
	for range concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := next.Add(1); i <= int64(calls); i = next.Add(1) {
				if err := generate(client, int(200+i%7*300)); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// generate makes one streaming call for a prompt of promptTokens tokens.
func generate(client testgrpc.TestServiceClient, promptTokens int) error {
	call := &grpclb.Call{Request: llmlb.Request{PromptTokens: promptTokens, MaxTokens: 64}}
	ctx, cancel := context.WithTimeout(grpclb.WithCall(context.Background(), call), 10*time.Second)
	defer cancel()
	stream, err := client.StreamingOutputCall(ctx, &testgrpc.StreamingOutputCallRequest{}, grpc.WaitForReady(true))
	if err != nil {
		return err
	}
	for first := true; ; first = false {
		_, err := stream.Recv()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		if first {
			call.FirstToken() // prefill is done: the prompt no longer counts as queued work
		}
	}
}
