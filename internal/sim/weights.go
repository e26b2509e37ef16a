package sim

import (
	"strconv"
	"strings"

	"github.com/llmlb/llmlb"
)

// weightedEndpoint is the endpoint of a replica that declares a weight to
// the routers ([Config.DeclareWeights]).
type weightedEndpoint struct {
	endpoint
	weight float64
}

// Weight returns the replica's declared weight, its speed at the start.
func (e *weightedEndpoint) Weight() float64 { return e.weight }

// newEndpoint returns the endpoint the routers know replica i by: one that
// declares its starting speed as its weight under DeclareWeights, else one
// that declares none.
func (c *Config) newEndpoint(key string, i int) llmlb.Endpoint {
	if !c.DeclareWeights {
		return &endpoint{key: key, idx: i}
	}
	return &weightedEndpoint{endpoint: endpoint{key: key, idx: i}, weight: c.speedAt(i, 0)}
}

// replicaOf returns the index of the replica behind ep, an endpoint made by
// newEndpoint.
func replicaOf(ep llmlb.Endpoint) int {
	if w, ok := ep.(*weightedEndpoint); ok {
		return w.idx
	}
	return ep.(*endpoint).idx
}

// startSpeeds returns every replica's speed at the start of the run, or nil
// if all are 1 and no weights are declared. c must be normalized.
func (c *Config) startSpeeds() []float64 {
	out := make([]float64, c.Replicas)
	unit := true
	for i := range out {
		out[i] = c.speedAt(i, 0)
		unit = unit && out[i] == 1
	}
	if unit && !c.DeclareWeights {
		return nil
	}
	return out
}

// speeds describes the replicas' speeds and their declaration for a header
// line, or returns "" for equal speeds not declared.
func (s *ScenarioInfo) speeds() string {
	if len(s.Speeds) == 0 {
		return ""
	}
	declared := "not declared to the routers"
	if s.DeclaredWeights {
		declared = "declared to the routers as weights"
	}
	return "replica speeds " + formatSpeeds(s.Speeds) + ", " + declared
}

// formatSpeeds writes speeds as llmlb-sim's -speeds takes them: runs of
// equal speeds as count x speed, such as 2x1,6x0.5.
func formatSpeeds(speeds []float64) string {
	var b strings.Builder
	for i := 0; i < len(speeds); {
		j := i + 1
		for j < len(speeds) && speeds[j] == speeds[i] {
			j++
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		if j-i > 1 {
			b.WriteString(strconv.Itoa(j-i) + "x")
		}
		b.WriteString(strconv.FormatFloat(speeds[i], 'g', -1, 64))
		i = j
	}
	return b.String()
}
