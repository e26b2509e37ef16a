package share_test

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/httplb"
	"github.com/llmlb/llmlb/kvevents"
	"github.com/llmlb/llmlb/prefix"
	"github.com/llmlb/llmlb/share"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// Two gateway replicas share their requests in flight through a NATS
// server (run in process here): the second steers away from the endpoint
// the first just loaded.
func Example() {
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true})
	if err != nil {
		panic(err)
	}
	srv.Start()
	defer srv.WaitForShutdown()
	defer srv.Shutdown()
	if !srv.ReadyForConnections(10 * time.Second) {
		panic("NATS not ready")
	}

	endpoints, err := httplb.NewEndpoints("http://10.0.0.7:8000", "http://10.0.0.8:8000")
	if err != nil {
		panic(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	replica := func(id string) (*share.Group, *llmlb.Balancer) {
		nc, err := nats.Connect(srv.ClientURL(), nats.MaxReconnects(-1))
		if err != nil {
			panic(err)
		}
		// No engine signal here; a real gateway passes its scraper as
		// Config.Signal.
		g, err := share.New(share.Config{Conn: nc, ID: id, Interval: 10 * time.Millisecond})
		if err != nil {
			panic(err)
		}
		b, err := llmlb.New(llmlb.LeastOutstanding(), llmlb.WithSignal(g, 0), llmlb.WithObserver(g.Observer(nil)))
		if err != nil {
			panic(err)
		}
		if err := b.Update(endpoints); err != nil {
			panic(err)
		}
		wg.Go(func() {
			_ = g.Run(ctx)
			nc.Close()
		})
		return g, b
	}
	_, a := replica("gateway-a")
	gb, b := replica("gateway-b")

	p, err := a.Pick(ctx, &llmlb.Request{PromptTokens: 1000})
	if err != nil {
		panic(err)
	}
	defer p.Done(nil)
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if l, ok := gb.Load(p.Endpoint().Key()); ok && l.Waiting == 1 {
			fmt.Println("gateway-b sees gateway-a's request waiting for its first token")
			break
		}
	}
	q, err := b.Pick(ctx, &llmlb.Request{PromptTokens: 1000})
	if err != nil {
		panic(err)
	}
	defer q.Done(nil)
	fmt.Println("gateway-b picks the other endpoint:", q.Endpoint().Key() != p.Endpoint().Key())
	// Output:
	// gateway-b sees gateway-a's request waiting for its first token
	// gateway-b picks the other endpoint: true
}

// ExampleRelay carries an engine's KV events to a router replica over NATS
// (a server run in process here). In production the Relay's Forward is a
// kvevents.Subscriber's Forward, in the one replica that follows the
// engines over ZMQ; here a batch is forwarded by hand.
func ExampleRelay() {
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true})
	if err != nil {
		panic(err)
	}
	srv.Start()
	defer srv.WaitForShutdown()
	defer srv.Shutdown()
	if !srv.ReadyForConnections(10 * time.Second) {
		panic("NATS not ready")
	}
	pubConn, err := nats.Connect(srv.ClientURL(), nats.MaxReconnects(-1))
	if err != nil {
		panic(err)
	}
	defer pubConn.Close()
	subConn, err := nats.Connect(srv.ClientURL(), nats.MaxReconnects(-1))
	if err != nil {
		panic(err)
	}
	defer subConn.Close()

	// The relaying replica:
	//	sub, err := kvevents.NewSubscriber(kvevents.Config{Forward: relay.Forward})
	relay, err := share.NewRelay(share.RelayConfig{Conn: pubConn})
	if err != nil {
		panic(err)
	}

	// Every replica: an Applier into its own index, fed by a Follower.
	hasher, err := prefix.NewHasher(prefix.HasherConfig{BlockTokens: 2})
	if err != nil {
		panic(err)
	}
	events, err := prefix.NewIndex(prefix.IndexConfig{BlockSize: 2, EventsOnly: true})
	if err != nil {
		panic(err)
	}
	ap, err := kvevents.NewApplier(kvevents.Config{Index: events, Hasher: hasher})
	if err != nil {
		panic(err)
	}
	salt := prefix.Salt{Model: "m"}
	if err := ap.SetEndpoints(map[string]prefix.Salt{"engine-0": salt}); err != nil {
		panic(err)
	}
	f, err := share.NewFollower(share.FollowerConfig{Conn: subConn, Sink: ap})
	if err != nil {
		panic(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = f.Run(ctx) })
	defer wg.Wait()
	defer cancel()

	prompt := hasher.HashTokens(salt, []uint32{1, 2, 3, 4})
	batch := kvevents.AppendBatch(nil, &kvevents.Batch{Events: []kvevents.Event{
		{Kind: kvevents.Stored, BlockHashes: []uint64{7001, 7002}, TokenIDs: []uint32{1, 2, 3, 4}, BlockSize: 2},
	}})
	// Until the Follower's subscription is in place, what is published is
	// lost; publish until it arrives.
	for seq := int64(0); events.MatchLen("engine-0", prompt, time.Now()) == 0; seq++ {
		relay.Forward("engine-0", seq, batch)
		time.Sleep(10 * time.Millisecond)
	}
	fmt.Println("blocks cached:", events.MatchLen("engine-0", prompt, time.Now()))
	// Output:
	// blocks cached: 2
}
