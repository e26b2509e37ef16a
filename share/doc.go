// Package share connects the llmlb balancers of several gateway replicas
// through NATS, so that each one sees its peers' requests in flight and the
// prefixes they routed, and relays the engines' KV events to all of them.
//
// Every replica of a gateway has its own [llmlb.Balancer], which counts
// exactly the work it sent itself and corrects a stale engine signal with
// it. What the other replicas sent since the engines were last observed is
// invisible to it, and so is where they sent which prompt prefix: two
// replicas herd onto the same idle engine, and place one prefix on
// different engines. A [Group] closes both gaps.
//
// # How it works
//
// Each replica publishes a batch every [Config].Interval (100 ms by
// default) on one NATS subject. A batch is an absolute snapshot, so a lost
// one costs nothing: per endpoint, the replica's requests in flight, split
// by pick time into buckets of one interval (requests outstanding, of those
// the ones before their first token, their tokens of work, and of those the
// prompt tokens the queued ones have still to prefill); for each
// bucket boundary of the last MaxSignalAge, how many requests in flight at
// that moment have finished since; and the prefix blocks of each pick since
// the last batch. A batch larger than the peers take (8 MiB, or the NATS
// server's max_payload if smaller, 1 MiB by default) is published in
// parts of some endpoints each, under the IDs "<ID>/part1", "<ID>/part2"...
// for all but the first, which peers count as the one replica that sent
// them (in [Stats].Peers and against MaxPeers); peers keep at most 64
// parts of 64 MiB in all, and the endpoints beyond are left out. The
// Group learns all this from the balancer's [llmlb.Observer]
// ([Group.Observer]), whose functions only update memory: the network is
// touched only by [Group.Run].
//
// The Group is also the balancer's [llmlb.Signal]. An engine's observation
// (a scrape of its metrics) counts the whole replica at the moment it was
// taken, including every router's requests then in flight. Group.Load
// returns it corrected for what happened since: plus the requests the peers
// picked at or after the observation's time (those streaming count as
// running, those before their first token as waiting, their tokens as KV
// usage), and minus the requests the peers picked before it and finished
// since (they were counted and are gone). The observation keeps its time,
// so the balancer then corrects it for its own requests, as it does alone:
// plus its dispatches since, minus its requests counted and finished since.
// Each request is thus counted once: by the observation if it was in
// flight then and still is, by its router's correction otherwise.
// Load also reports which of the waiting requests are the peers' and the
// prefill they queue ([llmlb.Load].PeerWaiting, PeerPrefillTokens), so that
// [llmlb.Default] prices the peers' queue at its true prefill, as it prices
// its own, rather than at a mean prompt.
// Pick times travel as ages relative to the batch, anchored at its arrival,
// so the replicas' clocks need not agree; a bucket that straddles the
// observation counts in proportion to its part after it. Without an inner
// signal, or without a usable observation, Load reports this replica's and
// the peers' requests in flight as an observation taken now.
//
// The estimate is as fresh as the last batch: a peer's requests picked or
// finished since it are unknown for up to an Interval, so keep the Interval
// well below the engines' scrape interval (the defaults are 100 ms and 1 s).
// Requests that never reached the engine (a refused connection) count as
// finished ones unless their Done says so with [llmlb.ErrNotSent], as
// httplb's and grpclb's do; and the KV usage is not lowered for finished
// requests.
//
// The peers' prefix blocks are recorded in the index the policy records its
// own decisions in ([Config].Index, with [prefix.Index.Record]), so a
// prefix-aware policy sees where every replica sent each prefix.
//
// # Faults
//
// Nothing on the path of [llmlb.Balancer.Pick] waits for the network. If
// NATS is down, Run stops publishing, the peers' batches expire after
// [Config].TTL (three intervals by default), and each balancer routes on its
// own state and the engines' signal, as it would without sharing. [Stats]
// says so (Connected, Unpublished), and so does the log: Run warns at the
// first batch it cannot publish, whether the connection went down or never
// came up (a wrong or unreachable URL given with nats.RetryOnFailedConnect),
// then once a minute while it stays down, and says when it connects. The
// nats.go connection reconnects by itself and restores the subscription,
// and sharing resumes with the next batch. A replica that stops publishing
// stops counting after the TTL.
//
// Memory is bounded whatever the peers send: at most [Config].MaxPeers
// peers (64 by default; further ones are rejected until one expires), the
// latest batch of each kept in at most about ten times its size (a message
// over 8 MiB is refused, and so are the parts of a batch beyond 64 MiB or
// 64 parts), at most about 1 MiB of memory kept from decoding one batch to
// decode the next, up to 256 batches and 32 MiB received by
// [Group.Run] and not yet applied (NATS drops the batches beyond, counted
// in [Stats].Rejected), this replica's work at most
// [Config].MaxEndpoints endpoints (1024) of at most 256 time buckets of 56
// bytes (a pick at an endpoint beyond them is dropped and counted, and
// keeps a count of its endpoint until it is done, so that its first token
// and completion release no other request's work), and at most
// [Config].MaxBlocks prefix blocks per batch (8192; a pick that does not
// fit is dropped and counted). The wire format is versioned and binary;
// its decoder rejects anything malformed. A Group reads only the sender
// of its own batches, which NATS echoes back to it.
//
// # Running several replicas
//
// All replicas of a gateway name the endpoints alike (the same keys), use
// the same prefix hashing, and connect to the same NATS with a distinct ID
// or none. Each one runs:
//
//	nc, err := nats.Connect(natsURL, nats.MaxReconnects(-1))
//	scraper, err := signals.NewScraper(signals.Config{Interval: time.Second})
//	err = scraper.SetTargets(metrics) // endpoint key -> its metrics URL
//	index, err := prefix.NewIndex(prefix.IndexConfig{})
//	group, err := share.New(share.Config{
//		Conn:         nc,
//		Signal:       scraper,         // peers' work is added to its observations
//		MaxSignalAge: 3 * time.Second, // as given to llmlb.WithSignal
//		Index:        index,           // peers' routed prefixes are recorded here
//	})
//	policy, err := llmlb.Default(llmlb.DefaultConfig{Index: index})
//	b, err := llmlb.New(policy,
//		llmlb.WithSignal(group, 3*time.Second),
//		llmlb.WithObserver(group.Observer(nil)), // or chained with yours
//	)
//	err = b.Update(endpoints)
//	go scraper.Run(ctx)
//	go group.Run(ctx)
//	transport, err := httplb.NewTransport(httplb.Config{Balancer: b})
//	http.ListenAndServe(":8080", httplb.NewProxy(transport))
//
// A Group starts no goroutine until Run, which returns when its context
// ends. Load, the Observer's functions, Stats, AppendBatch and Receive are
// safe for concurrent use.
//
// # Engine KV events for every replica
//
// Where the engines publish KV events (package kvevents), one replica can
// follow them for all, as NVIDIA Dynamo's event plane does: a
// kvevents.Subscriber in that replica forwards every batch to a [Relay],
// which publishes it on NATS, and each replica runs a [Follower] that hands
// the batches to its own kvevents.Applier. Each engine then has one ZMQ
// subscriber however many replicas there are. The Subscriber fills gaps in
// an engine's stream from its replay socket; NATS delivers at most once and
// cannot replay, so a batch lost between the Relay and a Follower drops
// that engine's blocks from the replica's index until they are stored
// again, rather than leave them guessed. Run the Relay too ([Relay.Run]):
// its heartbeats let the Followers drop the blocks of its engines if it
// dies without a word.
//
// A relayed message is a NATS message on the Relay's subject whose data is
// the engine's payload, as the engine published it, and whose headers say
// the rest: Llmlb-Endpoint, the endpoint key (in standard base64 when
// Llmlb-Endpoint-Encoding is "base64"); Llmlb-Seq, the engine's sequence
// number of the batch, or "clear" when the Followers must drop the
// endpoint's blocks, or "alive" for a heartbeat, whose period
// Llmlb-Interval gives in nanoseconds; Llmlb-Relay, the Relay's ID; and
// Llmlb-Relay-Msg, the message's number among those of the Relay process:
// a random instance in base 36, "-", and the number, from 1 (heartbeats
// included). A Follower that misses a number knows at once that messages
// were lost on the way (dropped by NATS before a slow Follower, or while
// its connection was down), if not of which endpoints: it drops the blocks
// of every endpoint that Relay relays, without waiting for each
// endpoint's next batch to show the gap. Relays before Llmlb-Relay-Msg send
// none, and their messages are read as before; Followers before it ignore
// it, so that versions mix during a rolling update.
//
// Several Relays may follow the same engines at once, for high
// availability or while a Relay is replaced. Each Follower hands each
// batch of an engine to its Sink once, from whichever Relay brings it
// first, recognising a repeat by its sequence number and payload, and
// clears an endpoint only when no Relay carries its batches any more: an
// engine that restarts (its batches numbered from 0 again) is cleared once
// every Relay has said so, and a Relay that stops or falls silent costs
// nothing while another relays its engines. Give the Relays distinct IDs,
// as the random default ones are.
//
// # Without NATS
//
// A Group whose Config has no Conn leaves the carrying to its caller, over
// another transport or on simulated time: every Interval, send the batch of
// [Group.AppendBatch] to each peer, in order, and hand each batch that
// arrives to [Group.Receive]. The Group reads the time from Config.Clock,
// so a simulator that sets the clock drives it deterministically, as the
// llmlb-sim command's routers do with -share.
//
// This package's plain data types (Config, FollowerConfig, RelayConfig,
// Stats) hold no lock: any number of goroutines may read a value of one at
// once, but none may write it meanwhile.
package share
