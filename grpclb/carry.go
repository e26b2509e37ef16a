package grpclb

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/llmlb/llmlb"
)

// A channel whose config update replaces its llmlb.Balancer (another
// policy, another parameter: see Config.sameBalancer) still has RPCs in
// flight that were picked with the old one; LLM streams run for minutes.
// The new balancer has to count them, or a policy that reads the
// endpoints' loads sends new RPCs to an endpoint busy with long streams as
// if it were idle until they end. grpc-go's least_request keeps its
// per-endpoint RPC counters across a config update, which does not
// replace it (balancer/leastrequest/leastrequest.go, grpc-go v1.85.0); a
// change of policy builds a new balancer there too, whose counts start at
// zero.
//
// Each balancer's RPCs are counted per endpoint (rpcCount). When the
// balancer is replaced, its counts move to the channel's carrier, and each
// of those RPCs, when it ends, takes one from the carrier instead: the
// carrier holds, per endpoint, the RPCs in flight that were picked with a
// replaced balancer. It makes the channel's balancer count them by picking
// the endpoint for each, with a request that excludes every other member
// (a placeholder pick), once the endpoint is a member; the end of one of
// those RPCs ends a placeholder. The balancer then counts each as an
// outstanding request of unknown prompt before its first token, charged
// its decode allowance, which is all that is known of it.

// replacedBit is set in an rpcCount once its balancer was replaced.
const replacedBit = 1 << 62

// rpcCount counts the RPCs in flight to one endpoint that were picked with
// one balancer of the channel.
type rpcCount struct {
	// n is the count, with replacedBit set once the count moved to the
	// carrier: the RPCs counted then, and those picked after, are the
	// carrier's, and each takes one from it when it ends.
	n     atomic.Int64
	key   string
	carry *carrier
}

// picked counts an RPC picked for the endpoint.
func (r *rpcCount) picked() {
	if r.n.Add(1)&replacedBit != 0 {
		r.carry.add(r.key) // picked with the old picker after the replacement
	}
}

// done counts the end of an RPC that picked counted; err is the error the
// RPC's pick ended with.
func (r *rpcCount) done(err error) {
	if r.n.Add(-1)&replacedBit != 0 {
		r.carry.release(r.key, err)
	}
}

// carrier holds a channel's RPCs in flight that were picked with a
// balancer the channel replaced, and has the channel's balancer count
// them.
type carrier struct {
	mu sync.Mutex // protects the fields below
	// lb is the channel's balancer; nil once the channel is closed.
	lb *llmlb.Balancer
	// members are lb's members as of its last membership update.
	members []string
	// keys holds the carried RPCs by endpoint key; lazily made.
	keys map[string]*carried
}

// carried is the RPCs to one endpoint picked with a replaced balancer that
// are still in flight: n of them, held the placeholder picks that lb
// counts for them, at most n.
type carried struct {
	n    int
	held []llmlb.Pick
}

// replace makes lb the channel's balancer and moves the counts of the
// balancer it replaces, old, to the carrier. The placeholders the replaced
// balancer held end. The caller holds the channel's lock.
func (c *carrier) replace(lb *llmlb.Balancer, old map[string]*rpcCount) {
	c.mu.Lock()
	for key, r := range old {
		if n := r.n.Or(replacedBit) &^ replacedBit; n > 0 {
			c.entry(key).n += int(n)
		}
	}
	var stale []llmlb.Pick
	for _, e := range c.keys {
		stale = append(stale, e.held...)
		e.held = nil
	}
	c.lb, c.members = lb, nil
	c.mu.Unlock()
	for _, p := range stale {
		p.Done(errNotSent) // on the replaced balancer, which nothing reads
	}
}

// adopt records the members of lb, the channel's balancer, after an
// update of its membership, and has lb count the carried RPCs of the
// members it does not count yet.
func (c *carrier) adopt(lb *llmlb.Balancer, eps []llmlb.Endpoint) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.lb != lb {
		return
	}
	c.members = c.members[:0]
	for _, ep := range eps {
		c.members = append(c.members, ep.Key())
	}
	for key, e := range c.keys {
		c.adoptLocked(key, e)
	}
}

// add counts an RPC to the endpoint key picked with a replaced balancer.
func (c *carrier) add(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.entry(key)
	e.n++
	c.adoptLocked(key, e)
}

// release counts the end of a carried RPC to the endpoint key, which ended
// with err, and ends a placeholder pick of it if one is left over.
func (c *carrier) release(key string, err error) {
	c.mu.Lock()
	e := c.keys[key]
	if e == nil {
		c.mu.Unlock()
		return // the channel closed meanwhile
	}
	e.n--
	var p llmlb.Pick
	if len(e.held) > max(e.n, 0) {
		p = e.held[len(e.held)-1]
		e.held[len(e.held)-1] = llmlb.Pick{}
		e.held = e.held[:len(e.held)-1]
	}
	if e.n <= 0 {
		delete(c.keys, key)
	}
	c.mu.Unlock()
	p.Done(err) // the zero Pick if none: a no-op
}

// close forgets the carried RPCs and ends their placeholders: the channel
// is closed.
func (c *carrier) close() {
	c.mu.Lock()
	var stale []llmlb.Pick
	for _, e := range c.keys {
		stale = append(stale, e.held...)
	}
	c.lb, c.members, c.keys = nil, nil, nil
	c.mu.Unlock()
	for _, p := range stale {
		p.Done(errNotSent)
	}
}

// entry returns the carried RPCs of key, made if there are none. The
// caller holds c.mu.
func (c *carrier) entry(key string) *carried {
	e := c.keys[key]
	if e == nil {
		if c.keys == nil {
			c.keys = make(map[string]*carried)
		}
		e = new(carried)
		c.keys[key] = e
	}
	return e
}

// adoptLocked makes lb count the carried RPCs e of the endpoint key that
// it does not count yet, if key is a member. Each is a pick of key with a
// request that excludes every other member, which the policy cannot but
// choose (unhealthy, it is picked in panic mode). The caller holds c.mu.
func (c *carrier) adoptLocked(key string, e *carried) {
	if c.lb == nil || len(e.held) >= e.n || !slices.Contains(c.members, key) {
		return
	}
	r := llmlb.Request{Exclude: make([]string, 0, len(c.members)-1)}
	for _, k := range c.members {
		if k != key {
			r.Exclude = append(r.Exclude, k)
		}
	}
	for len(e.held) < e.n {
		p, err := c.lb.Pick(context.Background(), &r)
		if err != nil {
			return // a policy that refuses the request: it stays uncounted
		}
		if ep := p.Endpoint(); ep == nil || ep.Key() != key {
			p.Done(errNotSent)
			return
		}
		e.held = append(e.held, p)
	}
}
