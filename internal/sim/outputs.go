package sim

import (
	"fmt"
	"math"
)

// OutputKnowledge is what the routers know of the output lengths of the
// requests they route ([Config].Outputs): llmlb charges each request its
// expected decode work, from the caller's estimate
// ([llmlb.Request].OutputTokens), else the lengths its balancer learned
// ([llmlb.WithOutputPrediction]), else a fixed decode allowance. It is a
// plain value, safe to use from any goroutine.
type OutputKnowledge uint8

// The kinds of knowledge of output lengths.
const (
	// OutputsUntold charges every request the decode allowance and tells
	// the routers nothing of output lengths, not even when a request
	// completes: the simulator's behaviour without Config.Outputs. A
	// policy that learns speeds ("default") then measures decode time
	// per token of the allowance.
	OutputsUntold OutputKnowledge = iota
	// OutputsAllowance charges every request the decode allowance, and
	// reports each completed request's output tokens to its balancer
	// ([llmlb.Pick.Generated]), as a proxy that counts the streamed tokens
	// does.
	OutputsAllowance
	// OutputsPredicted is OutputsAllowance with [llmlb.WithOutputPrediction]
	// (configured by Config.Prediction) on every balancer: each request is
	// charged the output length its balancer learned for its route
	// ([Request].Route, told as [llmlb.Request].Feature) from the route's
	// completed requests.
	OutputsPredicted
	// OutputsTrue is OutputsAllowance with every request's true output
	// length given as [llmlb.Request].OutputTokens: a caller that knows
	// exactly, the bound of any prediction.
	OutputsTrue
)

// String returns the knowledge's name, as the llmlb-sim command's -outputs
// flag and [Result].Outputs spell it: "" for OutputsUntold, then
// "allowance", "predict" and "true".
func (k OutputKnowledge) String() string {
	switch k {
	case OutputsUntold:
		return ""
	case OutputsAllowance:
		return "allowance"
	case OutputsPredicted:
		return "predict"
	case OutputsTrue:
		return "true"
	}
	return fmt.Sprintf("OutputKnowledge(%d)", uint8(k))
}

// outputsLabel returns the name of c's output knowledge for
// [Result].Outputs: its String, with the quantile charged, such as
// "predict q0.9", when the prediction charges one rather than the mean.
func (c *Config) outputsLabel() string {
	if c.Outputs == OutputsPredicted && c.Prediction.Quantile > 0 {
		return fmt.Sprintf("%v q%g", c.Outputs, c.Prediction.Quantile)
	}
	return c.Outputs.String()
}

// validateOutputs checks the output knowledge of c and its prediction's
// configuration, which llmlb would reject only when a run starts.
func (c *Config) validateOutputs() error {
	p := c.Prediction
	switch {
	case c.Outputs > OutputsTrue:
		return fmt.Errorf("%w: output knowledge %d", ErrInvalidConfig, c.Outputs)
	case !(p.Quantile >= 0 && p.Quantile < 1) || math.IsNaN(p.Quantile):
		return fmt.Errorf("%w: output prediction quantile %v, want in [0, 1)", ErrInvalidConfig, p.Quantile)
	case p.MinObservations < 0 || p.Window < 0 || p.MaxKinds < 0:
		return fmt.Errorf("%w: output prediction %+v: negative count", ErrInvalidConfig, p)
	}
	return nil
}
