package llmlb

import "sync/atomic"

// roundRobin is padded to a cache line: every pick writes next, and no
// other object should share its line.
type roundRobin struct {
	next atomic.Uint64
	_    [56]byte
}

// RoundRobin returns the policy that deals requests to the candidates in
// turn. It equalizes counts, not work: with LLM traffic, whose request costs
// vary by orders of magnitude, it is a baseline rather than a choice. An
// endpoint in slow start is skipped with probability 1 - its slow-start
// factor. Give each Balancer its own RoundRobin.
func RoundRobin() Policy { return new(roundRobin) }

func (p *roundRobin) Choose(c *Candidates) int {
	n := uint64(c.Len())
	if n == 1 {
		return 0 // no turn to take, and no random draw for slow start
	}
	start := p.next.Add(1) - 1
	for k := uint64(0); k < n; k++ {
		i := int((start + k) % n)
		if c.acceptSlow(i) {
			if k > 0 {
				p.next.Add(k)
			}
			return i
		}
	}
	return int(start % n)
}

type random struct{}

// Random returns the policy that picks a candidate uniformly at random. An
// endpoint in slow start is accepted with probability equal to its slow-start
// factor, otherwise another is drawn.
func Random() Policy { return random{} }

func (random) Choose(c *Candidates) int {
	n := uint64(c.Len())
	if n == 1 {
		return 0 // draw nothing from the balancer's random source
	}
	i := int(c.Uint64N(n))
	for tries := 0; tries < 8 && !c.acceptSlow(i); tries++ {
		i = int(c.Uint64N(n))
	}
	return i
}

// acceptSlow reports whether candidate i passes a coin flip weighted by its
// slow-start factor; it is true at once when no endpoint is in slow start.
func (c *Candidates) acceptSlow(i int) bool {
	if c.b.slowUntil.Load() == never {
		return true
	}
	st := c.state(i)
	f := c.weight(st) / st.staticWeight()
	return f >= 1 || c.Float64() < f
}
