// Package grpclb is a grpc-go load balancing policy that routes RPCs with an
// [llmlb.Balancer].
//
// # How it works
//
// A [Builder] builds one balancer per channel. Like grpc-go's own
// least_request and weighted_round_robin policies it gives each resolved
// endpoint a pick-first child (endpointsharding), so connection management,
// backoff and IDLE reconnection are grpc's. An endpoint joins the
// membership of the channel's llmlb.Balancer, keyed by its first address,
// when its child first becomes READY (with slow start on, the first ones
// listed after the balancer is built join at once: see
// Config.SlowStartWindow), and
// leaves it only when the resolver drops it. Resolved endpoints that share
// a first address are one endpoint to the adapter, with the addresses of
// all in the order listed, each once, and the attributes of the first
// listed (grpc-go, which tells endpoints apart by their addresses, would
// give each a child, all connecting to that address first); of endpoints
// that list the same addresses in different orders, the first listed is
// kept. So a resolver's list always gives the same members under the same
// keys.
// Readiness is health: an endpoint whose child leaves READY
// (a GOAWAY such as the server's connection age limit, connection lost,
// server stopped, TRANSIENT_FAILURE) is marked unhealthy with
// llmlb.Balancer.SetHealthy and healthy again when its child is READY
// again, so the RPCs still running on its old connection keep counting
// against it until they end (with slow start, one that reconnects without a
// failed attempt stays healthy, its RPCs sent elsewhere meanwhile: see
// Config.SlowStartWindow). Every change publishes a new picker, which
// picks an unhealthy endpoint only when a request's every candidate is
// unhealthy (llmlb's panic mode: the program's marks, or an
// llmlb.Request.Exclude, leave no healthy one), and then one whose
// connection is READY if any is a candidate. An RPC picked for an endpoint
// whose connection is not READY waits while it connects and, unless it
// waits for ready, fails while it is in TRANSIENT_FAILURE. While no
// endpoint is READY the children's picker is used: RPCs queue while
// connecting (balancer.ErrNoSubConnAvailable) and fail fast in
// TRANSIENT_FAILURE unless they wait for ready; so they do while the only
// READY endpoints are ones the program marked unhealthy and another, one
// of the first listed since the balancer was built, makes its first
// connection attempt. An RPC whose llmlb.Request.Exclude leaves no member
// meets the resolved endpoints it does not exclude that have not been
// READY since the balancer was built as grpc meets their connections: it
// queues while one connects, and fails fast while all are in
// TRANSIENT_FAILURE unless it waits for ready; one that excludes every
// resolved endpoint fails with Unavailable.
// The program's marks are kept apart from the adapter's: an endpoint the program marks unhealthy
// with [Builder.SetHealthy], given the balancer Options.OnBalancer
// receives, stays so, its connection READY or not, until the program marks
// it healthy, and is then healthy once its connection is READY. A mark
// lasts while that balancer serves the channel, set before the resolver
// lists the endpoint or while it does; of the endpoints it does not list,
// the marks of the 1024 most recently marked are remembered. A channel gets a new balancer when a config change replaces
// the policy or changes a parameter (one that spells out a default, or
// changes only Config.OOBReportInterval, keeps the balancer) and when it
// leaves idle mode: OnBalancer receives it before any endpoint joins it,
// and is where the program marks again the endpoints it holds unhealthy.
// The RPCs in flight that were picked with a replaced balancer count on
// the new one too, until each ends, from the time their endpoint joins it:
// a least-loaded policy does not take an endpoint busy with long streams
// for an idle one. The new balancer knows nothing of them but their
// number: it counts each as an outstanding request before its first token,
// of unknown prompt, charged its decode allowance (a pick of the endpoint
// with a request that excludes every other member, which its Stats show and
// the RPC's end ends).
//
// The picker builds an llmlb.Request for each RPC from a [Call] the caller
// put in the RPC's context ([WithCall], [WithRequest]), or else from the
// call metadata keys x-llmlb-prompt-tokens, x-llmlb-max-tokens,
// x-llmlb-output-tokens, x-llmlb-affinity-key and x-llmlb-tenant. Each key
// is a lookup through the RPC's context and its outgoing metadata (grpc-go
// reads several keys only by copying the whole metadata), so on an RPC that
// carries metadata of its own, such as an authorization header, reading
// them costs more than the pick itself (BenchmarkPickGRPC, "rpc"); a Call
// is one context lookup. Attach a Call where the pick's cost matters. The
// pick handle's Done is called from grpc's PickResult.Done when the RPC ends;
// a streaming caller reports the first token with [Call.FirstToken] (grpc
// has no hook for it; without it, the prompt counts as pending prefill until
// the RPC ends).
//
// The balancer's signal is a signals.Store fed with ORCA load reports: those
// the server attaches to each RPC's trailer (DoneInfo.ServerLoad, enabled on
// grpc-go servers by orca.CallMetricsServerOption), and, when
// Config.OOBReportInterval is set, those of an out-of-band ORCA stream per
// READY connection (orca.Register on the server). Reports are mapped with
// signals.OrcaMapping: named metrics kv_cache_usage_perc or
// kv_cache_utilization, num_requests_running and num_requests_waiting.
// Per-call reports only refresh an endpoint that is picked: an endpoint the
// policy avoids keeps its last report until it is older than
// Config.MaxSignalAge, is then scored on this channel's own counts again,
// and the next call it takes brings a fresh report. Out-of-band streams keep
// every endpoint's observation fresh whether it is picked or not.
//
// # Selecting the policy
//
// The service config selects the balancer by its registered name and the
// llmlb policy and its parameters by a [Config]:
//
//	{"loadBalancingConfig": [{"llmlb": {"policy": "default", "slowStartWindow": "30s"}}]}
//
// [Policies] lists the policy names. grpc-go finds balancers in a global
// registry filled, by convention, from init functions; this package
// registers only when [Register] is called, under the name it is given.
//
// Builders and the balancers they build are safe for concurrent use; the
// package starts no goroutines of its own (grpc runs the out-of-band
// streams).
//
// This package's plain data types (Config, Options) hold no lock: any number
// of goroutines may read a value of one at once, but none may write it
// meanwhile.
package grpclb
