package kvevents_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"os/signal"
	"time"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/kvevents"
	"github.com/llmlb/llmlb/prefix"
)

// Example feeds the events-only index of llmlb's default policy from two
// vLLM engines started with
//
//	--kv-events-config '{"enable_kv_cache_events": true, "publisher": "zmq",
//	  "endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558", "topic": "kv-events"}'
func Example() {
	hasher, err := prefix.NewHasher(prefix.HasherConfig{BlockTokens: 16, ShareAcrossTenants: true})
	if err != nil {
		log.Fatal(err)
	}
	events, err := prefix.NewIndex(prefix.IndexConfig{BlockSize: 16, EventsOnly: true})
	if err != nil {
		log.Fatal(err)
	}
	sub, err := kvevents.NewSubscriber(kvevents.Config{Index: events, Hasher: hasher})
	if err != nil {
		log.Fatal(err)
	}
	salt := prefix.Salt{Model: "meta-llama/Llama-3.1-8B-Instruct"}
	// Call SetEndpoints again whenever the balancer's membership changes.
	err = sub.SetEndpoints(map[string]kvevents.Endpoint{
		"10.0.0.7:8000": {PubAddr: "tcp://10.0.0.7:5557", ReplayAddr: "tcp://10.0.0.7:5558", Topic: "kv-events", Salt: salt},
		"10.0.0.8:8000": {PubAddr: "tcp://10.0.0.8:5557", ReplayAddr: "tcp://10.0.0.8:5558", Topic: "kv-events", Salt: salt},
	})
	if err != nil {
		log.Fatal(err)
	}
	policy, err := llmlb.Default(llmlb.DefaultConfig{Events: events})
	if err != nil {
		log.Fatal(err)
	}
	_ = policy // build the Balancer with it; hash prompts with hasher into Request.Prefix

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	_ = sub.Run(ctx) // until interrupted
}

// ExampleDecodeBatch decodes a batch as vLLM encodes it.
func ExampleDecodeBatch() {
	payload := kvevents.AppendBatch(nil, &kvevents.Batch{TS: 1700000000.5, DPRank: 0, Events: []kvevents.Event{
		{Kind: kvevents.Stored, BlockHashes: []uint64{101, 102}, TokenIDs: []uint32{1, 2, 3, 4}, BlockSize: 2, Medium: "GPU"},
		{Kind: kvevents.Removed, BlockHashes: []uint64{99}, Medium: "GPU"},
	}})
	var b kvevents.Batch
	if err := kvevents.DecodeBatch(&b, payload); err != nil {
		log.Fatal(err)
	}
	for _, e := range b.Events {
		fmt.Println(e.Kind, e.BlockHashes, e.TokenIDs)
	}
	// Output:
	// BlockStored [101 102] [1 2 3 4]
	// BlockRemoved [99] []
}

// ExampleApplier indexes batches that arrive by other means than a
// Subscriber's connection (here, encoded in place): a router's prompt then
// matches the blocks the engine reported.
func ExampleApplier() {
	hasher, err := prefix.NewHasher(prefix.HasherConfig{BlockTokens: 2})
	if err != nil {
		log.Fatal(err)
	}
	events, err := prefix.NewIndex(prefix.IndexConfig{BlockSize: 2, EventsOnly: true})
	if err != nil {
		log.Fatal(err)
	}
	ap, err := kvevents.NewApplier(kvevents.Config{Index: events, Hasher: hasher})
	if err != nil {
		log.Fatal(err)
	}
	salt := prefix.Salt{Model: "m"}
	if err := ap.SetEndpoints(map[string]prefix.Salt{"engine-0": salt}); err != nil {
		log.Fatal(err)
	}
	// The engine cached two blocks of a prompt; its own hashes are opaque.
	ap.Apply("engine-0", 0, kvevents.AppendBatch(nil, &kvevents.Batch{Events: []kvevents.Event{
		{Kind: kvevents.Stored, BlockHashes: []uint64{7001, 7002}, TokenIDs: []uint32{1, 2, 3, 4}, BlockSize: 2},
	}}))
	prompt := hasher.HashTokens(salt, []uint32{1, 2, 3, 4, 5, 6})
	fmt.Println("blocks cached:", events.MatchLen("engine-0", prompt, time.Now()))
	ap.Apply("engine-0", 5, nil) // a clear: what the engine holds is unknown
	fmt.Println("after a clear:", events.MatchLen("engine-0", prompt, time.Now()))
	// Output:
	// blocks cached: 2
	// after a clear: 0
}
