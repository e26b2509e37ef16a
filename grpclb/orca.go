package grpclb

import (
	"time"

	v3orcapb "github.com/cncf/xds/go/xds/data/orca/v3"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/signals"
)

// recorder feeds ORCA load reports, per-call and out-of-band, into a store.
type recorder struct {
	store   *signals.Store
	owned   bool // the store belongs to one channel and is pruned with it
	mapping signals.OrcaMapping
	clock   llmlb.Clock
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
func (r *recorder) record(key string, rep *v3orcapb.OrcaLoadReport) {
	_ = r.store.RecordOrca(key, reportOf(rep), r.now(), r.mapping)
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
