package grpclb

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"

	"google.golang.org/grpc/balancer"
	"google.golang.org/grpc/serviceconfig"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/prefix"
	"github.com/llmlb/llmlb/signals"
)

// DefaultName is the name under which [Register] registers the balancer when
// Options.Name is empty.
const DefaultName = "llmlb"

// Sentinel errors. Errors returned by this package wrap one of them, so
// callers branch with [errors.Is].
var (
	// ErrInvalidConfig: a service config's balancer config is malformed,
	// names an unknown policy, or has a parameter out of range or that the
	// policy does not take.
	ErrInvalidConfig = errors.New("grpclb: invalid config")
	// ErrInvalidOptions: an Options field is invalid.
	ErrInvalidOptions = errors.New("grpclb: invalid options")
)

// Options configures a [Builder]. The zero value is valid: every field's
// zero value is a documented default.
type Options struct {
	// Name is the balancer's name in service configs. "" means
	// [DefaultName]. It must be lower case, without spaces.
	Name string
	// Store receives the ORCA load reports of every channel the builder
	// serves and is the balancers' signal. Nil means each channel gets its
	// own store, and forgets an endpoint's observation when the resolver
	// drops the endpoint. A shared store is not pruned when endpoints leave:
	// it keeps every endpoint any channel (or other writer) has recorded
	// until it holds its MaxKeys, and then evicts one not reported lately
	// for each new one (see signals.StoreConfig.MaxKeys).
	Store *signals.Store
	// OrcaMapping names the ORCA metrics that make up an observation. The
	// zero value reads the named metrics (or named utilizations)
	// kv_cache_usage_perc or kv_cache_utilization, and the named metrics
	// num_requests_running and num_requests_waiting. A report with none of
	// the mapped metrics (say, only CPU utilization) or with a value out of
	// range is ignored, and the endpoint keeps its previous observation.
	OrcaMapping signals.OrcaMapping
	// Clock timestamps ORCA reports and drives the balancers' signal age
	// and slow start. Nil means the system clock.
	Clock llmlb.Clock
	// Index, if set, is the prefix index of the prefix-aware policies
	// ("prefix-aware", "sglang-cache-aware", "dynamo-kv", "gie-default",
	// "default") of every channel, so that engine KV events fed into it
	// (Index.Stored, Index.Removed) inform routing. A config's blockTokens,
	// if set, must equal its block size. Nil means each balancer has its
	// own index, fed by its own picks.
	Index *prefix.Index
	// Events, if set, is an index fed by engine KV events alone
	// (prefix.IndexConfig.EventsOnly), which the "default" policy of every
	// channel reads next to its own decisions (llmlb.DefaultConfig.Events)
	// and "dynamo-kv" reads instead of Index, as Dynamo's router does when
	// its workers publish events. Its block size must be that of the
	// policy's index.
	Events *prefix.Index
	// NewRand returns the random source of a new balancer (one per channel
	// and config). Nil means math/rand/v2's global generator.
	NewRand func() rand.Source
	// OnBalancer, if set, is called with the channel's target each time a
	// channel builds its llmlb.Balancer: when the first config arrives,
	// when a config change replaces the policy or sets a parameter of the
	// policy or the balancer to another value, and when the channel
	// leaves idle mode (see grpc.WithIdleTimeout), for grpc then builds
	// the channel's balancer anew. A config change that builds the same
	// balancer (one that only spells out a parameter's default, or
	// changes only OOBReportInterval) keeps it, with its accounting and
	// marks. The new balancer has no members yet, none of the marks of
	// the one it replaces, and none of its accounting: the RPCs in flight
	// stay charged to the old one until they end, and the new one sees
	// their endpoints without them. No endpoint joins it before
	// OnBalancer returns. Use it to read Stats, and
	// keep the balancer to mark endpoints unhealthy with
	// [Builder.SetHealthy] (the adapter marks an endpoint unhealthy while
	// its connection is not READY, and keeps the program's marks apart
	// from its own); mark the endpoints the program holds unhealthy here,
	// so that they join the balancer unhealthy. Never call Update, the
	// adapter owns membership: an RPC picked for an endpoint the adapter
	// did not add fails with an Internal status. It is called from grpc's
	// balancer goroutine, outside the channel's locks, and must not block.
	OnBalancer func(target string, b *llmlb.Balancer)
}

// Builder builds llmlb balancers for grpc-go channels. It implements
// balancer.Builder and balancer.ConfigParser. Create one with [NewBuilder]
// or [Register]. A Builder is safe for concurrent use; grpc calls Build once
// per channel.
type Builder struct {
	opts Options

	mu sync.Mutex // protects channels
	// channels maps the llmlb.Balancer of each open channel to the
	// channel, for SetHealthy; lazily initialized.
	channels map[*llmlb.Balancer]*lbBalancer
}

// NewBuilder returns a Builder configured by opts, without registering it.
// grpc-go selects balancers by name from its global registry, so a channel
// can use the builder only once it is registered (see [Register]); an
// unregistered Builder serves a parent balancer that builds its children
// itself.
func NewBuilder(opts Options) (*Builder, error) {
	if opts.Name == "" {
		opts.Name = DefaultName
	}
	if strings.ToLower(opts.Name) != opts.Name || strings.ContainsAny(opts.Name, " \t\r\n") {
		return nil, fmt.Errorf("%w: name %q must be lower case without spaces", ErrInvalidOptions, truncate(opts.Name))
	}
	if opts.Events != nil && !opts.Events.EventsOnly() {
		return nil, fmt.Errorf("%w: Events must be an events-only index (prefix.IndexConfig.EventsOnly)", ErrInvalidOptions)
	}
	return &Builder{opts: opts}, nil
}

// Register builds a Builder for opts and registers it with grpc-go under
// opts.Name, so that service configs can select it:
//
//	{"loadBalancingConfig": [{"llmlb": {"policy": "default"}}]}
//
// grpc-go's own balancers register themselves from init functions; this
// package does not, because the registry is global, last registration wins,
// and balancer.Register is not safe for concurrent use. Importing a library
// should not change how every channel in the process may be configured.
// Call Register once, early in main or in a test's TestMain, before any
// channel is dialed and not concurrently with dials; give each differently
// configured Builder its own name. A name that another balancer holds
// (grpc-go's "round_robin" or "pick_first", say) is refused with an error
// wrapping [ErrInvalidOptions]: registering it would replace that balancer
// for every channel of the process. A Builder of this package registered
// under the name before is replaced.
func Register(opts Options) (*Builder, error) {
	b, err := NewBuilder(opts)
	if err != nil {
		return nil, err
	}
	if old := balancer.Get(b.Name()); old != nil {
		if _, ours := old.(*Builder); !ours {
			return nil, fmt.Errorf("%w: name %q is another balancer's; registering it would replace that balancer in every channel", ErrInvalidOptions, b.Name())
		}
	}
	balancer.Register(b)
	return b, nil
}

// Name returns the name the balancer is selected by in service configs.
func (b *Builder) Name() string { return b.opts.Name }

// ParseConfig parses the balancer's JSON config, a [Config]. It returns an
// error wrapping [ErrInvalidConfig] for malformed JSON, an unknown policy or
// parameter, a parameter the policy does not take, or a value the policy
// rejects; grpc then keeps the channel's previous config.
func (b *Builder) ParseConfig(js json.RawMessage) (serviceconfig.LoadBalancingConfig, error) {
	return parseConfig(js, b.opts.Index, b.opts.Events)
}

// Build returns a new balancer for the channel cc. It is called by grpc.
func (b *Builder) Build(cc balancer.ClientConn, opts balancer.BuildOptions) balancer.Balancer {
	return newBalancer(b, cc, opts)
}

// SetHealthy marks the endpoint key healthy or unhealthy in lb, the
// llmlb.Balancer of one of b's channels (see Options.OnBalancer), for the
// program. The channel keeps the program's mark apart from its own, which
// it sets while the endpoint's connection is not READY: the endpoint is
// picked (outside panic mode, see llmlb.Balancer.SetHealthy) only while the
// program has not marked it unhealthy and its connection is READY. An
// endpoint marked unhealthy thus stays so when its connection comes back,
// and one marked healthy again is picked once its connection is READY.
//
// The key is the endpoint's first address (see the package doc). An
// endpoint joins lb when its connection is first READY, but the channel
// keeps the mark from the start, for as long as lb serves the channel: an
// endpoint marked unhealthy before it joins joins unhealthy, whether the
// resolver listed it when it was marked or lists it later, and one the
// resolver drops and lists again is still unhealthy. Of the endpoints the
// resolver does not list, the channel remembers the unhealthy marks of the
// 1024 most recently marked or dropped, keyed by at most 1024 bytes: a
// program that marks more forgets the oldest marks, and the memory they
// take stays bounded (about 1 MiB per channel). A channel that gets a new
// balancer (see Options.OnBalancer) drops the marks; mark again there.
// SetHealthy fails with an error wrapping llmlb.ErrUnknownEndpoint only for
// a key that is neither a member of lb nor the key of an endpoint the
// channel's resolver lists, and that the channel cannot remember: the empty
// key, or one longer than 1024 bytes. For a balancer that no open channel
// of b uses (its channel closed or went idle, or a config change replaced
// it) SetHealthy is lb.SetHealthy(key, healthy). It may be called from any
// goroutine, Options.OnBalancer included.
//
// Prefer it to lb.SetHealthy: the channel finds a mark the program set
// there only when its endpoints' connections next change state, and cannot
// see one that marks unhealthy an endpoint whose connection is already not
// READY, which it then marks healthy when the connection is READY again.
func (b *Builder) SetHealthy(lb *llmlb.Balancer, key string, healthy bool) error {
	b.mu.Lock()
	ch := b.channels[lb]
	b.mu.Unlock()
	if ch != nil {
		if ok, err := ch.setHealthy(lb, key, healthy); ok {
			return err
		}
	}
	return lb.SetHealthy(key, healthy)
}

// track records that the channel ch uses lb in place of old; either may be
// nil.
func (b *Builder) track(old, lb *llmlb.Balancer, ch *lbBalancer) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if old != nil && b.channels[old] == ch {
		delete(b.channels, old)
	}
	if lb != nil {
		if b.channels == nil {
			b.channels = make(map[*llmlb.Balancer]*lbBalancer)
		}
		b.channels[lb] = ch
	}
}
