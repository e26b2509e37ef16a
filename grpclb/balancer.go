package grpclb

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/balancer"
	"google.golang.org/grpc/balancer/endpointsharding"
	"google.golang.org/grpc/balancer/pickfirst"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/orca"
	"google.golang.org/grpc/resolver"

	v3orcapb "github.com/cncf/xds/go/xds/data/orca/v3"
	"github.com/hashicorp/golang-lru/v2/simplelru"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/signals"
)

// lbBalancer is the balancer of one channel. It shards the resolved
// endpoints over pick-first children (endpointsharding), makes the children
// that have been READY (and, with slow start, those listed when the
// llmlb.Balancer was built: see fresh) the members of an llmlb.Balancer,
// healthy while they are READY and the program has not marked them
// unhealthy, and publishes a picker that picks with it. It embeds the
// channel's ClientConn to intercept the children's UpdateState and
// NewSubConn calls.
//
// grpc calls the balancer.Balancer methods and the SubConn state listeners
// from one goroutine, and the children call UpdateState from it too, except
// that endpointsharding calls ExitIdle on a child that goes IDLE from a
// goroutine of its own, and the pick-first child then calls UpdateState
// from there (endpointsharding.go, endpointState.UpdateState, grpc-go
// v1.85.0). mu guards the fields below against that goroutine, the
// pickers' Done callbacks, the out-of-band listeners and
// Builder.SetHealthy.
type lbBalancer struct {
	balancer.ClientConn
	child   balancer.Balancer
	builder *Builder
	target  string
	rec     *recorder

	// addrKey maps each resolved address to its endpoint's key. It is read
	// without locks by the out-of-band listeners, which grpc calls under a
	// lock of its own that stopping a listener also takes, and by the
	// recorder.
	addrKey atomic.Pointer[map[string]string]

	// carry holds the RPCs in flight that were picked with a balancer
	// the channel replaced, and has lb count them.
	carry carrier

	mu       sync.Mutex // protects the fields below
	cfg      *Config
	lb       *llmlb.Balancer
	subConns map[*subConnState]struct{}
	// rpcs counts lb's RPCs in flight by endpoint key; it moves to carry
	// when lb is replaced.
	rpcs map[string]*rpcCount
	// The adapter marks a member of lb healthy exactly when it is in
	// neither set below, and sets its mark whenever either changes.
	// unready holds the members whose child was not READY at the last
	// UpdateState; sick the endpoints the program marked unhealthy, with
	// Builder.SetHealthy or, as UpdateState finds, lb.SetHealthy: members,
	// and resolved endpoints not yet members, which join lb unhealthy.
	// Both hold only endpoints the resolver lists, and start empty with
	// each new lb.
	unready, sick map[string]bool
	// remembered holds the program's unhealthy marks of endpoints the
	// resolver does not list: marked before it listed them, or listed when
	// marked and dropped since. A mark moves to sick when the resolver
	// lists its endpoint. It starts empty with each new lb.
	remembered rememberedMarks
	// failed holds the members whose child has been in TRANSIENT_FAILURE
	// since it was last READY. With slow start, a member that left READY
	// and is not in it is healthy while its child reconnects (see
	// UpdateState).
	failed map[string]bool
	// fresh holds the endpoints the resolver listed when lb was built (or,
	// if it listed none then, in its first update since that lists some)
	// whose child has not yet been READY or in TRANSIENT_FAILURE. While one the
	// program has not marked makes its first connection attempt, RPCs wait
	// for it rather than go to READY members the program marked. When the
	// config enables slow start, they are members from the first
	// UpdateState, healthy while they make that attempt, so that they make
	// up lb's first membership with those already READY and are not slowed
	// down for connecting a moment after them (see UpdateState).
	fresh map[string]bool
	// listed: the resolver has listed an endpoint since lb was built, and
	// fresh was filled.
	listed bool
	// hooking: Options.OnBalancer has not yet returned for lb. No endpoint
	// joins lb meanwhile, so that the program's marks set there apply
	// from the first pick: UpdateState ignores the children's states, and
	// UpdateClientConnState has the children push theirs again once the
	// hook returns.
	hooking bool
	closed  bool
}

// subConnState tracks one SubConn for out-of-band ORCA reporting.
type subConnState struct {
	sc    balancer.SubConn
	addr  string
	ready bool
	stop  func() // stops the OOB listener; nil when none runs
}

func newBalancer(bb *Builder, cc balancer.ClientConn, opts balancer.BuildOptions) *lbBalancer {
	store, owned := bb.opts.Store, false
	if store == nil {
		store, owned = new(signals.Store), true
	}
	b := &lbBalancer{
		ClientConn: cc,
		builder:    bb,
		target:     opts.Target.String(),
		subConns:   make(map[*subConnState]struct{}),
		unready:    make(map[string]bool),
		sick:       make(map[string]bool),
		failed:     make(map[string]bool),
		fresh:      make(map[string]bool),
		rpcs:       make(map[string]*rpcCount),
	}
	b.rec = &recorder{store: store, owned: owned, mapping: bb.opts.OrcaMapping, clock: bb.opts.Clock,
		keys: &b.addrKey}
	b.child = endpointsharding.NewBalancer(b, opts, balancer.Get(pickfirst.Name).Build, endpointsharding.Options{})
	return b
}

// newLLMLB builds the llmlb.Balancer for cfg.
func (b *lbBalancer) newLLMLB(cfg *Config) (*llmlb.Balancer, error) {
	policy, err := cfg.newPolicy()
	if err != nil {
		return nil, err
	}
	opts := append(cfg.options(), llmlb.WithSignal(b.rec.signal(), time.Duration(cfg.MaxSignalAge)))
	if b.builder.opts.Clock != nil {
		opts = append(opts, llmlb.WithClock(b.builder.opts.Clock))
	}
	if b.builder.opts.NewRand != nil {
		if src := b.builder.opts.NewRand(); src != nil {
			opts = append(opts, llmlb.WithRand(src))
		}
	}
	lb, err := llmlb.New(policy, opts...)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	return lb, nil
}

// UpdateClientConnState applies a resolver update and its config.
func (b *lbBalancer) UpdateClientConnState(ccs balancer.ClientConnState) error {
	cfg, _ := ccs.BalancerConfig.(*Config)
	if cfg == nil {
		cfg = &Config{Policy: DefaultPolicy, index: b.builder.opts.Index, events: b.builder.opts.Events}
	}
	b.mu.Lock()
	var hook func(string, *llmlb.Balancer)
	built := b.lb == nil || !cfg.sameBalancer(b.cfg)
	if built {
		lb, err := b.newLLMLB(cfg)
		if err != nil {
			b.mu.Unlock()
			return fmt.Errorf("%v: %w", err, balancer.ErrBadResolverState)
		}
		b.builder.track(b.lb, lb, b)
		// The RPCs in flight on the replaced balancer, if any, are
		// counted by the new one until they end.
		b.carry.replace(lb, b.rpcs)
		b.rpcs = make(map[string]*rpcCount)
		b.lb = lb
		clear(b.unready)
		clear(b.sick)
		clear(b.failed)
		b.remembered.clear()
		hook = b.builder.opts.OnBalancer
		b.hooking = hook != nil
	}
	lb := b.lb
	oobChanged := b.cfg == nil || b.cfg.OOBReportInterval != cfg.OOBReportInterval
	b.cfg = cfg

	eps, keys := keyEndpoints(ccs.ResolverState.Endpoints)
	if built {
		clear(b.fresh)
		b.listed = false
	}
	if !b.listed {
		// The first endpoints listed since lb was built make up its first
		// membership, even when a first update listed none.
		for addr, key := range keys {
			if addr == key && key != "" {
				b.fresh[key] = true
				b.listed = true
			}
		}
	}
	for addr, key := range keys {
		if addr == key && b.remembered.take(key) {
			b.sick[key] = true // marked before the resolver listed it
		}
	}
	// Publish the keys before pruning, so that a report recorded for a
	// dropped endpoint meanwhile is either pruned here or undone by the
	// recorder (see recorder.record).
	old := b.addrKey.Swap(&keys)
	if old != nil && b.rec.owned {
		for _, key := range *old {
			if keys[key] != key {
				b.rec.store.Delete(key)
			}
		}
	}
	if oobChanged {
		for s := range b.subConns {
			b.restartOOBLocked(s)
		}
	}
	b.mu.Unlock()
	if hook != nil {
		// Outside the lock, so that the hook may call Builder.SetHealthy.
		func() {
			defer func() {
				b.mu.Lock()
				b.hooking = false
				b.mu.Unlock()
			}()
			hook(b.target, lb)
		}()
	}

	// The child pushes its aggregated state inline, which publishes a
	// picker for the new balancer (and brings in the states UpdateState
	// ignored while the hook ran).
	rs := ccs.ResolverState
	rs.Endpoints = eps
	return b.child.UpdateClientConnState(balancer.ClientConnState{
		ResolverState: pickfirst.EnableHealthListener(rs),
	})
}

// UpdateState receives the aggregated state of the children, brings the
// membership and health of the llmlb.Balancer up to date, and publishes a
// new picker.
//
// An endpoint joins when its child becomes READY; before that nothing was
// picked for it, so it has no accounting to keep. It then stays a member
// while its child exists, and is marked unhealthy while the child is not
// READY: after a GOAWAY (the server's connection age limit, a graceful
// stop) the child reconnects while the RPCs picked for the old connection
// still run, and their counts must stay with the endpoint until they are
// done. The order of the changes keeps a pick from finding a member healthy
// whose child is not READY: an endpoint leaving READY is marked unhealthy
// before Update gives it its child's new picker, and one coming back is
// marked healthy after.
//
// With slow start, a fresh endpoint (see lbBalancer.fresh) joins at once
// and is healthy while its child connects for the first time; the picker,
// which is told it is not READY, sends an RPC picked for it to a healthy
// READY member or has it wait (see picker.failed). Once its child has been
// READY or in TRANSIENT_FAILURE it is a member like any other.
//
// Other than a fresh one, a member is healthy only while its child is READY
// and the program has not marked it unhealthy (see Builder.SetHealthy). A
// mark that differs from the one the adapter last set was set by the
// program with lb.SetHealthy since: UpdateState takes it for the
// program's, so that it outlasts the connection's changes too. An endpoint
// the program marked before it joined joins unhealthy: it is first given a
// picker that has an RPC picked for it wait for the next picker, then
// marked, then given its child's picker, so that no RPC reaches it
// meanwhile. While Options.OnBalancer runs for a new lb, where the program
// sets its marks, UpdateState changes nothing (see hooking).
func (b *lbBalancer) UpdateState(state balancer.State) {
	children := endpointsharding.ChildStatesFromPicker(state.Picker)

	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed || b.lb == nil || b.hooking {
		return
	}
	// healthy holds the members and whether they are marked healthy.
	stats := b.lb.Stats()
	healthy := make(map[string]bool, len(stats))
	for _, s := range stats {
		healthy[s.Key] = s.Healthy
	}
	eps := make([]llmlb.Endpoint, 0, len(children))
	seen := make(map[string]bool, len(children))
	var (
		back    []string    // members to mark healthy once Update is done
		held    []int       // indexes in eps of those joining marked unhealthy
		unready []string    // members whose child is not READY, for the picker
		marked  []string    // members the program marked unhealthy, for the picker
		pending []*endpoint // resolved endpoints not yet members, for the picker
	)
	slow := b.cfg != nil && b.cfg.SlowStartWindow > 0
	// anyReady: a member is READY; healthyReady: one the program has not
	// marked; connecting: an endpoint it has not marked makes its first
	// connection attempt.
	anyReady, healthyReady, connecting := false, false, false
	for _, c := range children {
		if len(c.Endpoint.Addresses) == 0 {
			continue
		}
		key := c.Endpoint.Addresses[0].Addr
		if key == "" || seen[key] {
			continue // keyEndpoints leaves no two children one key
		}
		seen[key] = true
		ready := c.State.ConnectivityState == connectivity.Ready
		failing := c.State.ConnectivityState == connectivity.TransientFailure
		if ready || failing {
			delete(b.fresh, key) // its first connection attempt is over
		}
		firstTry := !ready && b.fresh[key] && !b.sick[key]
		connecting = connecting || firstTry
		wasHealthy, member := healthy[key]
		if ready {
			delete(b.failed, key)
		} else if failing && member {
			b.failed[key] = true
		}
		// With slow start, a fresh endpoint, and a member whose child
		// reconnects without having failed since it was last READY (its
		// connection was closed or lost, and the server is not known to
		// be down), count as READY for their health, not for picks: a
		// mark and unmark would restart the member's slow start, and a
		// warm replica would be ramped for a mere reconnection.
		reconnecting := member && !ready && !failing && !b.failed[key] && !b.sick[key]
		fresh := slow && (firstTry || reconnecting)
		p := c.State.Picker
		if p == nil {
			p = noSubConnPicker{}
		}
		if !member && !ready && !fresh {
			// Never READY since lb was built: nothing to keep. A request
			// that excludes every member waits for it (picker.pending).
			pending = append(pending, &endpoint{key: key, picker: p})
			continue
		}
		if member && wasHealthy == (b.unready[key] || b.sick[key]) {
			setMark(b.sick, key, !wasHealthy) // the program's lb.SetHealthy
		}
		setMark(b.unready, key, !ready && !fresh)
		anyReady = anyReady || ready
		healthyReady = healthyReady || ready && !b.sick[key]
		switch want := (ready || fresh) && !b.sick[key]; {
		case member && wasHealthy && !want:
			_ = b.lb.SetHealthy(key, false) // a member: cannot fail
		case member && !wasHealthy && want:
			back = append(back, key)
		case !member && !want: // READY, marked by the program before it joined
			held = append(held, len(eps))
		}
		if !ready {
			unready = append(unready, key)
		}
		if b.sick[key] {
			marked = append(marked, key)
		}
		eps = append(eps, &endpoint{key: key, picker: p, ready: ready, fresh: fresh, rpcs: b.rpcCountLocked(key)})
	}
	// Keys are non-empty and distinct, so Update cannot fail, nor can
	// SetHealthy of a member.
	if len(held) > 0 {
		joining := make([]llmlb.Endpoint, len(held))
		for i, j := range held {
			joining[i] = eps[j]
			eps[j] = &endpoint{key: eps[j].Key(), picker: noSubConnPicker{}, ready: true}
		}
		_ = b.lb.Update(eps)
		for i, j := range held {
			_ = b.lb.SetHealthy(eps[j].Key(), false)
			eps[j] = joining[i]
		}
	}
	_ = b.lb.Update(eps)
	for _, key := range back {
		_ = b.lb.SetHealthy(key, true) // a member since Update: cannot fail
	}
	b.carry.adopt(b.lb, eps)
	for key, r := range b.rpcs {
		if !seen[key] && r.n.Load() == 0 {
			delete(b.rpcs, key) // left the membership, nothing in flight
		}
	}
	for _, marks := range []map[string]bool{b.unready, b.failed} {
		for key := range marks {
			if !seen[key] {
				delete(marks, key) // left the membership
			}
		}
	}
	for key := range b.sick {
		if !seen[key] && !b.rec.resolved(key) {
			// Dropped by the resolver: remembered in case it lists the
			// endpoint again.
			delete(b.sick, key)
			b.remembered.add(key)
		}
	}
	for key := range b.fresh {
		if !b.rec.resolved(key) {
			delete(b.fresh, key) // dropped: it joins anew if listed again
		}
	}
	if anyReady && !healthyReady && connecting {
		// Panic mode is for when no healthy endpoint is left, not for the
		// moment a marked one connects first: RPCs wait for the others'
		// first connection attempts.
		b.ClientConn.UpdateState(balancer.State{ConnectivityState: connectivity.Connecting, Picker: noSubConnPicker{}})
		return
	}
	if anyReady {
		b.ClientConn.UpdateState(balancer.State{
			ConnectivityState: connectivity.Ready,
			Picker:            &picker{lb: b.lb, rec: b.rec, unready: unready, marked: marked, pending: pending},
		})
		return
	}
	// No READY endpoint: the children's picker queues RPCs while they
	// connect and fails them when all are in transient failure.
	b.ClientConn.UpdateState(state)
}

// rpcCountLocked returns the count of lb's RPCs in flight to the endpoint
// key, made if there is none. The caller holds b.mu.
func (b *lbBalancer) rpcCountLocked(key string) *rpcCount {
	r := b.rpcs[key]
	if r == nil {
		r = &rpcCount{key: key, carry: &b.carry}
		b.rpcs[key] = r
	}
	return r
}

// setMark adds key to marks if on, and removes it otherwise.
func setMark(marks map[string]bool, key string, on bool) {
	if on {
		marks[key] = true
	} else {
		delete(marks, key)
	}
}

// setHealthy records the program's mark of the endpoint key of lb, a member
// or an endpoint the resolver lists, and sets lb's mark of a member to
// match. It reports false, and does nothing, if lb is not the channel's
// balancer.
func (b *lbBalancer) setHealthy(lb *llmlb.Balancer, key string, healthy bool) (bool, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed || b.lb != lb {
		return false, nil
	}
	if err := lb.SetHealthy(key, healthy && !b.unready[key]); err != nil && (key == "" || !b.rec.resolved(key)) {
		// Neither a member nor resolved: remembered for when the
		// resolver lists it.
		if key == "" || len(key) > maxRememberedKeyBytes {
			return true, err
		}
		if healthy {
			b.remembered.take(key)
		} else {
			b.remembered.add(strings.Clone(key)) // not a part of a larger string
		}
		return true, nil
	}
	setMark(b.sick, key, !healthy) // a resolved endpoint's, for when it joins
	return true, nil
}

// Bounds of the unhealthy marks a channel remembers for endpoints its
// resolver does not list (see Builder.SetHealthy): a program that marks
// many addresses no resolver lists holds at most maxRememberedMarks keys of
// at most maxRememberedKeyBytes each, about 1 MiB, per channel.
const (
	maxRememberedMarks    = 1024
	maxRememberedKeyBytes = 1024
)

// rememberedMarks is a set of endpoint keys that forgets the least recently
// added one past maxRememberedMarks. The zero value is an empty set.
type rememberedMarks struct {
	keys *simplelru.LRU[string, struct{}] // lazily made
}

// add adds key, or makes it the most recently added.
func (m *rememberedMarks) add(key string) {
	if m.keys == nil {
		m.keys, _ = simplelru.NewLRU[string, struct{}](maxRememberedMarks, nil) // a positive size cannot fail
	}
	m.keys.Add(key, struct{}{})
}

// take removes key and reports whether it was in the set.
func (m *rememberedMarks) take(key string) bool {
	return m.keys != nil && m.keys.Remove(key)
}

// len returns the number of keys in the set.
func (m *rememberedMarks) len() int {
	if m.keys == nil {
		return 0
	}
	return m.keys.Len()
}

func (m *rememberedMarks) clear() { m.keys = nil }

// NewSubConn intercepts the children's SubConns to follow their state for
// out-of-band ORCA reporting.
func (b *lbBalancer) NewSubConn(addrs []resolver.Address, opts balancer.NewSubConnOptions) (balancer.SubConn, error) {
	s := new(subConnState)
	if len(addrs) > 0 {
		s.addr = addrs[0].Addr
	}
	listener := opts.StateListener
	opts.StateListener = func(st balancer.SubConnState) {
		b.subConnStateChanged(s, st)
		if listener != nil {
			listener(st)
		}
	}
	//lint:ignore SA1019 the pick-first children create their SubConns through this wrapper, which must forward them
	sc, err := b.ClientConn.NewSubConn(addrs, opts)
	if err != nil {
		return nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	s.sc = sc
	if !b.closed {
		b.subConns[s] = struct{}{}
	}
	return sc, nil
}

func (b *lbBalancer) subConnStateChanged(s *subConnState, st balancer.SubConnState) {
	b.mu.Lock()
	defer b.mu.Unlock()
	s.ready = st.ConnectivityState == connectivity.Ready
	if st.ConnectivityState == connectivity.Shutdown {
		delete(b.subConns, s)
	}
	b.restartOOBLocked(s)
}

// restartOOBLocked starts or stops the out-of-band listener of s to match
// its readiness and the configured interval.
func (b *lbBalancer) restartOOBLocked(s *subConnState) {
	if s.stop != nil {
		s.stop()
		s.stop = nil
	}
	if b.closed || !s.ready || s.sc == nil || b.cfg == nil || b.cfg.OOBReportInterval <= 0 {
		return
	}
	l := &oobListener{b: b, addr: s.addr}
	s.stop = orca.RegisterOOBListener(s.sc, l, orca.OOBListenerOptions{ReportInterval: time.Duration(b.cfg.OOBReportInterval)})
}

// keyOf returns the endpoint key of a resolved address.
func (b *lbBalancer) keyOf(addr string) string {
	if m := b.addrKey.Load(); m != nil {
		if k, ok := (*m)[addr]; ok {
			return k
		}
	}
	return addr
}

// ResolverError forwards a resolver error to the children.
func (b *lbBalancer) ResolverError(err error) { b.child.ResolverError(err) }

// UpdateSubConnState is unused: SubConns report through their listeners.
func (b *lbBalancer) UpdateSubConnState(balancer.SubConn, balancer.SubConnState) {}

// ExitIdle asks the children to connect.
func (b *lbBalancer) ExitIdle() { b.child.ExitIdle() }

// Close stops the out-of-band listeners and closes the children.
func (b *lbBalancer) Close() {
	b.mu.Lock()
	b.closed = true
	b.builder.track(b.lb, nil, b)
	for s := range b.subConns {
		if s.stop != nil {
			s.stop()
			s.stop = nil
		}
	}
	clear(b.subConns)
	b.carry.close()
	b.mu.Unlock()
	b.child.Close()
}

// endpoint is a member as of one UpdateState: its key, and the picker and
// readiness of its pick-first child then. Update replaces a member's
// Endpoint with the new value, so a pick gets the child's latest picker.
type endpoint struct {
	key    string
	picker balancer.Picker
	ready  bool // the child was READY
	fresh  bool // healthy while its child first connects (lbBalancer.fresh)
	// rpcs counts the RPCs picked for the endpoint with the balancer
	// that has it as a member; nil for a stand-in that is never picked.
	rpcs *rpcCount
}

func (e *endpoint) Key() string { return e.key }

// noSubConnPicker stands for the picker of a child that has published none.
type noSubConnPicker struct{}

func (noSubConnPicker) Pick(balancer.PickInfo) (balancer.PickResult, error) {
	return balancer.PickResult{}, balancer.ErrNoSubConnAvailable
}

// oobListener records the out-of-band reports of one SubConn.
type oobListener struct {
	b    *lbBalancer
	addr string
}

func (l *oobListener) OnLoadReport(r *v3orcapb.OrcaLoadReport) {
	l.b.rec.record(l.b.keyOf(l.addr), r)
}
