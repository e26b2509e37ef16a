package grpclb

import (
	"sync/atomic"
	"time"

	v3orcapb "github.com/cncf/xds/go/xds/data/orca/v3"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/internal/stamped"
	"github.com/llmlb/llmlb/signals"
)

// recorder feeds ORCA load reports, per-call and out-of-band, into a store.
type recorder struct {
	store   *signals.Store
	owned   bool // the store belongs to one channel and is pruned with it
	mapping signals.OrcaMapping
	clock   llmlb.Clock
	seen    atomic.Bool // a report was recorded into an owned store
	// keys is the channel's map of resolved addresses to endpoint keys
	// (lbBalancer.addrKey); an owned store holds only endpoints in it.
	keys *atomic.Pointer[map[string]string]
}

// signal returns the balancers' signal: the store, behind a check that
// answers without a lookup until the first report, when the store is the
// channel's own (no one else records into it). Without ORCA reports, every
// pick then skips its store lookups.
func (r *recorder) signal() llmlb.Signal {
	if !r.owned {
		return r.store
	}
	return (*ownedSignal)(r)
}

// ownedSignal is a recorder's owned store as a signal.
type ownedSignal recorder

func (s *ownedSignal) Load(key string) (llmlb.Load, bool) {
	if !s.seen.Load() {
		return llmlb.Load{}, false
	}
	return s.store.Load(key)
}

func (r *recorder) now() time.Time {
	if r.clock == nil {
		return time.Now()
	}
	return r.clock.Now()
}

// record records the report as an observation of the endpoint key, taken
// now. A report without the mapped metrics (for example one with only CPU
// utilization), or with values out of range, is ignored: it says nothing
// the balancer can use, and the endpoint keeps its previous observation.
// So is, in an owned store, the report of an endpoint the resolver dropped,
// brought by a call that outlived it: the store was pruned of it, and
// nothing would prune it again.
func (r *recorder) record(key string, rep *v3orcapb.OrcaLoadReport) {
	if r.owned && !r.resolved(key) {
		return
	}
	if err := r.store.RecordOrca(key, reportOf(rep), r.now(), r.mapping); err != nil {
		return
	}
	if r.owned && !r.resolved(key) {
		// Dropped meanwhile: the pruning may have run before the record.
		r.store.Delete(key)
		return
	}
	if !r.seen.Load() {
		r.seen.Store(true)
	}
}

// resolved reports whether key is the key of an endpoint the resolver
// currently lists.
func (r *recorder) resolved(key string) bool {
	if r.keys == nil {
		return false
	}
	m := r.keys.Load()
	return m != nil && (*m)[key] == key
}

// reportOf converts grpc's ORCA report to the signals package's.
func reportOf(p *v3orcapb.OrcaLoadReport) signals.OrcaReport {
	return signals.OrcaReport{
		CPUUtilization:         p.GetCpuUtilization(),
		MemUtilization:         p.GetMemUtilization(),
		ApplicationUtilization: p.GetApplicationUtilization(),
		RPSFractional:          p.GetRpsFractional(),
		EPS:                    p.GetEps(),
		Utilization:            nonEmpty(p.GetUtilization()),
		RequestCost:            nonEmpty(p.GetRequestCost()),
		NamedMetrics:           nonEmpty(p.GetNamedMetrics()),
	}
}

// nonEmpty returns nil for an empty map. A non-empty map is shared, not
// copied: the mapping only reads it.
func nonEmpty(m map[string]float64) map[string]float64 {
	if len(m) == 0 {
		return nil
	}
	return m
}

// Recorded reports whether any report was recorded. It marks the signal
// as one that stamps each observation with the time it is recorded (see
// record), which spares the balancer a clock reading per pick while an
// endpoint has no observation, and every Load while there is none at all.
func (s *ownedSignal) Recorded(stamped.Token) bool { return s.seen.Load() }

// Loader reads the store's observations of key without a lookup each time;
// the balancer calls it only once Recorded is true.
func (s *ownedSignal) Loader(t stamped.Token, key string) func() *llmlb.Load {
	return s.store.Loader(t, key)
}

var (
	_ stamped.Signal             = (*ownedSignal)(nil)
	_ stamped.Loader[llmlb.Load] = (*ownedSignal)(nil)
)
