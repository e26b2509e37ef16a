package gateway

import (
	"errors"
	"sync"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/retry"
)

// health marks the replicas on the balancer for the two that keep them out of
// picks, the ejector and the scrapes that find an engine asleep
// ([signals.Observation].Asleep), so that neither undoes the other: a replica
// is marked healthy when neither keeps it out. The ejector is given health as
// its [retry.Health] in the balancer's place; sleeps are marked through
// setAsleep. The balancer picks no unhealthy replica while a healthy one is a
// candidate, and picks among the unhealthy ones when none is: a sleeping
// replica, whose zero requests would otherwise make it the idlest, takes no
// request while another is awake, and when all sleep, the requests wait for
// one to wake rather than fail. (vLLM queues what a sleeping engine is sent
// until wake_up: since vllm-project/vllm#34528 EngineCore.sleep pauses the
// scheduler first, and resume_scheduler "flush[es] any requests queued while
// paused", vllm/v1/engine/core.py; before it, the engine crashed on them,
// #15483.)
//
// As the ejector does with a balancer of its own ([retry.Health]), health
// marks a replica unhealthy only if it is healthy when the first of the two
// takes it out, and marks healthy again, when neither holds it out any
// longer, only the replicas it marked: a replica the program marked
// unhealthy on [Gateway.Balancer] before stays out. A mark the program sets
// while health holds the replica out takes effect but is not recorded. All
// methods are safe for concurrent use.
type health struct {
	b *llmlb.Balancer

	mu sync.Mutex // guards the maps, and orders the marks on b
	// ejected holds the replicas the ejector marked unhealthy (ejected or
	// cooling down); asleep those whose last trusted scrape found the
	// engine asleep. Both hold members only.
	ejected map[string]bool
	asleep  map[string]bool
	// marked holds the replicas health marked unhealthy on b: those it
	// marks healthy again when neither state holds them out.
	marked map[string]bool
}

var _ retry.Health = (*health)(nil)

func newHealth(b *llmlb.Balancer) *health {
	return &health{b: b, ejected: make(map[string]bool), asleep: make(map[string]bool), marked: make(map[string]bool)}
}

// SetHealthy records the ejector's mark and marks the replica healthy only
// if it is not asleep either. Like the balancer's, it fails for a key that
// is not a member.
func (h *health) SetHealthy(key string, healthy bool) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if healthy {
		delete(h.ejected, key)
	} else {
		h.ejected[key] = true
	}
	return h.markLocked(key)
}

// Stats returns the balancer's Stats, which the ejector reads for the
// membership.
func (h *health) Stats() []llmlb.EndpointStats { return h.b.Stats() }

// setAsleep records whether the replica key is asleep, and marks it if
// that changed; it reports whether it did.
func (h *health) setAsleep(key string, asleep bool) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.asleep[key] == asleep {
		return false
	}
	if asleep {
		h.asleep[key] = true
	} else {
		delete(h.asleep, key)
	}
	// A key that is not (yet) a member is forgotten: its next scrape
	// tries again.
	return h.markLocked(key) == nil
}

// isAsleep reports whether the replica key is held out as asleep.
func (h *health) isAsleep(key string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.asleep[key]
}

// anyIn reports whether some key of keys is held out by neither the
// ejector, a sleep nor the program's mark (unhealthy on the balancer while
// neither of the others holds it, so not health's own), and whether some
// key is held out as asleep. A key that is not a member is not in.
func (h *health) anyIn(keys []string) (in, asleep bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, k := range keys {
		switch {
		case h.asleep[k]:
			asleep = true
		case h.ejected[k]:
		default:
			// Read under h.mu, which orders health's own marks: one
			// unhealthy here is the program's.
			if s, member := h.b.StatsOf(k); member && s.Healthy {
				return true, asleep
			}
		}
	}
	return false, asleep
}

// countIn returns how many keys of keys are in, as anyIn tells one, up to
// limit.
func (h *health) countIn(keys []string, limit int) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, k := range keys {
		if n >= limit {
			break
		}
		if h.asleep[k] || h.ejected[k] {
			continue
		}
		if s, member := h.b.StatsOf(k); member && s.Healthy {
			n++
		}
	}
	return n
}

// errNotMember is the error of a mark of a replica that is not a member.
var errNotMember = errors.New("gateway: not a replica")

// markLocked marks key on the balancer from both states, and forgets it if
// it is not a member. It marks key unhealthy only if the balancer has it
// healthy, and healthy only if it marked it unhealthy. h.mu is held.
func (h *health) markLocked(key string) error {
	out := h.ejected[key] || h.asleep[key]
	var err error
	switch {
	case out && !h.marked[key]:
		s, member := h.b.StatsOf(key)
		switch {
		case !member:
			err = errNotMember
		case s.Healthy:
			if err = h.b.SetHealthy(key, false); err == nil {
				h.marked[key] = true
			}
		}
		// Unhealthy already: the program's mark, left as it is.
	case !out && h.marked[key]:
		err = h.b.SetHealthy(key, true)
		delete(h.marked, key)
	default:
		if _, member := h.b.StatsOf(key); !member {
			err = errNotMember
		}
	}
	if err != nil {
		delete(h.ejected, key)
		delete(h.asleep, key)
		delete(h.marked, key)
	}
	return err
}

// retain forgets the replicas not in keys, which have left the balancer: a
// replica that comes back joins it healthy, as a new one.
func (h *health) retain(keys map[string]string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for k := range h.ejected {
		if _, ok := keys[k]; !ok {
			delete(h.ejected, k)
		}
	}
	for k := range h.asleep {
		if _, ok := keys[k]; !ok {
			delete(h.asleep, k)
		}
	}
	for k := range h.marked {
		if _, ok := keys[k]; !ok {
			delete(h.marked, k)
		}
	}
}
