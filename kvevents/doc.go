// Package kvevents follows the KV-cache event streams that vLLM and SGLang
// publish over ZMQ and keeps a [prefix.Index] exactly in step with what each
// engine holds in its prefix cache.
//
// # The stream
//
// An engine started with a ZMQ KV event publisher sends one message per
// scheduler step on a PUB socket: the frames [topic, sequence number (8
// bytes, big-endian, from 0 in each engine process), payload]. The payload
// is a MessagePack batch [ts, events, data_parallel_rank] whose events are
// BlockStored (the engine's hashes of the blocks cached, the hash of the
// block before them, their token IDs, the block size, the LoRA adapter, the
// medium, the keys other than tokens the hashes mix in, the KV-cache group
// and its attention type), BlockRemoved (hashes evicted) and
// AllBlocksCleared. vLLM and SGLang have encoded events as positional
// arrays and, since mid 2026, as maps keyed by field name; block hashes
// are integers or byte strings depending on the version and the hash
// function; fields were added over time, and SGLang's salted BlockStored
// has a map where vLLM's has a string. SGLang's 2026 positional events
// follow the layout KV-aware routers read by position
// (TestBlockStoredWireFormat in its
// test/registered/unit/disaggregation/test_kv_events.py): vLLM's fields,
// then locality and ownership (and kv_cache_spec_kind and
// kv_cache_spec_sliding_window on BlockRemoved), the salted BlockStored's
// metadata last, and its salt copied into extra_keys tagged
// "dynamo-cache-salt:" as Dynamo tags the salts it hands vLLM. [DecodeBatch]
// reads every one of these forms, skips what it does not know, and rejects
// what exceeds [MaxPayloadBytes], [MaxEventsPerBatch], [MaxBlocksPerEvent] or
// [MaxTokensPerEvent]; an event of a class it does not know is dropped,
// whatever its fields hold, and the rest of its batch applied. The engine
// also binds a replay (ROUTER) socket that answers a sequence number with
// the batches it still buffers from that number on, then an end marker:
// each as [seq, payload] (SGLang, vLLM before 2026) or as [topic, seq,
// payload] (vLLM since 2026), both of which the subscriber reads. SGLang,
// when its publisher has a snapshot endpoint, appends the publisher's epoch
// to the topic frame of each live message ("\x00sgl-kv-epoch=" and a UUID
// drawn in each engine process); a SUB socket matches the topic as a
// prefix, so the endpoint's topic still receives them.
//
// # The subscriber
//
// A [Subscriber] runs one subscription per endpoint, set with
// [Subscriber.SetEndpoints] whenever the balancer's membership changes and
// run by [Subscriber.Run]. Each subscription connects to the endpoint's PUB
// socket, reconnects after failures with jittered exponential back-off, and
// applies every batch in sequence order:
//
//   - A BlockStored is translated into the router's own hashes: the hash of
//     its parent block is looked up in a bounded per-endpoint map from engine
//     hash to router hash ([Config.MaxBlocks]), and the chain continues from
//     there with [prefix.Hasher.AppendTokens] over the event's token IDs (from
//     the root of the endpoint's [Endpoint.Salt], with the event's LoRA
//     adapter and cache salt as its Adapter and Namespace, when there is no
//     parent). The blocks then match exactly the prompts the router hashes
//     with the same hasher and salt. Blocks deeper in their chain than the
//     hasher's MaxBlocks, which no prompt the router hashes reaches, take
//     no room: they are skipped, as are those stored after them. Blocks
//     whose parent is unknown, whose hashes mix in other keys (multimodal
//     inputs, prompt embeddings: [Event.Salted]) or that come with an
//     event_version newer than this package knows, that live outside GPU
//     memory or that the engine reports REMOTE, or with a locality this
//     package does not know, or that belong to a KV-cache group
//     other than a full-attention one are not indexed: a missing block
//     costs a cache hit, a wrong one would send requests to the wrong
//     replica.
//   - A model mixing attention types (sliding-window or Mamba layers with
//     full attention) has a KV-cache group per type, all storing and
//     evicting a prompt's blocks under the same hashes. Only full-attention
//     groups hold a whole prefix, so only they are indexed: vLLM names each
//     group's type on BlockStored ([Event].GroupKind), and its BlockRemoved
//     are applied by the type learned for their group. Without types,
//     group 0 is indexed, as Dynamo's router does.
//   - A BlockRemoved removes the blocks; AllBlocksCleared clears the
//     endpoint. vLLM does not deduplicate cached blocks: a prompt sent
//     twice at once may be cached twice, a BlockStored for each copy and
//     a BlockRemoved when each is evicted, so the copies of a block are
//     counted per KV-cache group and the block stays indexed until the
//     last goes. An event of a class this package does not know (a newer
//     engine's) is dropped, the rest of its batch applied, and counted in
//     [Stats].Unknown.
//   - A gap in sequence numbers is filled from the replay socket. If the
//     replay cannot fill it, the engine restarted (sequence numbers went
//     back, the last batch applied is not what the replay returns under
//     its number, or the epoch in the topic changed), or a batch cannot be
//     decoded, the endpoint's blocks are cleared ([prefix.Index.Cleared]):
//     what it holds is then unknown, and is never guessed. Without a
//     replay socket and without an epoch, nothing tells an engine that
//     restarted while the subscriber was away from one that did not, so
//     the blocks are cleared on every new connection too.
//
// [Stats] counts what each subscription did. An endpoint removed from the
// set, or the whole subscriber when Run returns, has its blocks dropped from
// the index, since nothing keeps them current any more.
//
// # Engines
//
// vLLM publishes with --kv-events-config; the fields are those of vLLM's
// KVEventsConfig (enable_kv_cache_events, publisher, endpoint,
// replay_endpoint, buffer_steps, hwm, max_queue_size, topic):
//
//	vllm serve MODEL --block-size 16 --enable-prefix-caching \
//	  --kv-events-config '{"enable_kv_cache_events": true, "publisher": "zmq",
//	    "endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558", "topic": "kv-events"}'
//
// SGLang takes the same JSON in --kv-events-config, without
// enable_kv_cache_events (the flag's presence enables publishing); its block
// size is its --page-size, whose default of 1 token must be raised to the
// router's block size:
//
//	python -m sglang.launch_server --model-path MODEL --page-size 16 \
//	  --kv-events-config '{"publisher": "zmq", "endpoint": "tcp://*:5557",
//	    "replay_endpoint": "tcp://*:5558", "topic": "kv-events"}'
//
// Then subscribe to tcp://HOST:5557 with replay tcp://HOST:5558 and topic
// "kv-events". With data parallelism, rank r publishes on the endpoint's
// port + r: subscribe to each rank as an endpoint of its own. The router's
// [prefix.Hasher] must hash token IDs (not bytes), with the engine's block
// size, and a salt the subscriber knows: [Endpoint.Salt] holds the model
// and, under tenant isolation, the tenant an engine serves; otherwise
// create the router's hasher with [prefix.HasherConfig.ShareAcrossTenants].
// A request's LoRA adapter and cache_salt go in its salt's Adapter and
// Namespace, as the engine's events tell them.
//
// A [Publisher] speaks the same protocol from Go: cmd/llmlb-engine uses it
// to publish its emulated engines' events (-kv-events-port).
//
// # Forwarding, and many routers
//
// With many router replicas, one subscription per engine can serve them
// all. A Subscriber with [Config].Forward set indexes nothing: it passes
// each batch it would apply, in order, with the endpoint key and the
// engine's sequence number, and a clear wherever it would drop the
// endpoint's blocks, to that function; package share's Relay publishes
// them on NATS. Each router hands the batches it receives (share's
// Follower does) to an [Applier], which translates them into its own index
// with its own hasher. An Applier cannot ask for a replay, so it drops an
// endpoint's blocks on a gap in its sequence (the blocks stored after it
// are indexed again) and knows nothing of the blocks stored before its
// first batch until they are stored again.
//
// # Concurrency and resources
//
// Subscriber, Applier and Publisher methods are safe for concurrent use.
// Creating any of them starts nothing: their Run methods start their goroutines (one per
// endpoint for a Subscriber) and stop them all before returning. Memory is
// bounded per endpoint by MaxBlocks map entries, one decoded batch (at most 16
// bytes per byte of its payload, see [MaxPayloadBytes]), and the messages received
// and not yet applied: about [MaxPayloadBytes] at most on the PUB socket,
// and as much on the replay socket while a replay runs. A subscription
// that falls that far behind stops reading its connection until it
// catches up; the engine's socket meanwhile queues what follows, or drops
// it, which the subscription sees as a gap. The ZMQ implementation is
// pure Go (github.com/go-zeromq/zmq4); it reads each message whole, so the
// Subscriber closes a connection, and reconnects after a back-off, as soon
// as its peer announces a message larger than a batch of [MaxPayloadBytes]
// with its topic and sequence number, and when the ZMTP handshake takes
// more than 5 seconds (ReplayTimeout for a replay).
//
// This package's plain data types (Batch, Config, Endpoint, Event,
// PublisherConfig, Stats) hold no lock: any number of goroutines may read a
// value of one at once, but none may write it meanwhile.
package kvevents
