package grpclb

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"time"

	"google.golang.org/grpc/serviceconfig"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/prefix"
)

// DefaultPolicy is the policy used when a config names none.
const DefaultPolicy = "default"

// maxConfigBytes bounds the size of a balancer config accepted by
// ParseConfig.
const maxConfigBytes = 64 << 10

// Config is the balancer's configuration in a gRPC service config: the JSON
// object under the balancer's name in loadBalancingConfig, for example
//
//	{"loadBalancingConfig": [{"llmlb": {"policy": "p2c", "score": "kv", "maxSignalAge": "5s"}}]}
//
// Every field is optional; the zero value of each is a documented default.
// Fields that configure a policy are accepted only with a policy that reads
// them, and unknown fields are rejected, so a typo fails loudly instead of
// being ignored. Durations are strings in Go or protobuf JSON form ("10s",
// "1.5s", "250ms").
type Config struct {
	serviceconfig.LoadBalancingConfig `json:"-"`

	// Policy names the policy; "" means [DefaultPolicy]. See [Policies].
	Policy string `json:"policy,omitempty"`

	// DecodeAllowance is the decode work in tokens charged to a request of
	// unknown output length (llmlb.WithDecodeAllowance). Nil means
	// llmlb.DefaultDecodeAllowance.
	DecodeAllowance *int `json:"decodeAllowance,omitempty"`
	// MaxSignalAge is how old an ORCA observation may be before the
	// endpoint is scored on this balancer's own counts; 0 means
	// llmlb.DefaultMaxSignalAge.
	MaxSignalAge Duration `json:"maxSignalAge,omitempty"`
	// SlowStartWindow enables slow start (llmlb.SlowStart) for endpoints
	// the resolver adds to a running balancer, for an endpoint whose
	// connection is READY again after its connection attempts failed
	// (TRANSIENT_FAILURE: the server was down, or, with grpc health
	// checking, not serving; like Envoy's slow start after failing an
	// active health check), and for one the program marks healthy again;
	// 0 disables it.
	//
	// An endpoint whose connection is closed or lost and READY again
	// without a failed attempt (a GOAWAY such as the server's connection
	// age limit, a dropped connection) is not slowed down: its server kept
	// running, and its cache is warm. It stays healthy while it
	// reconnects. The endpoints listed when the balancer is built (the
	// channel's first config, a config change that builds another one,
	// leaving idle mode), or, if none is listed then, those of the
	// resolver's first update that lists some, are not slowed down either,
	// whichever connects first: they join at once, and count as healthy
	// while they make their first connection attempt. An RPC the policy
	// picks for an endpoint that is healthy while it connects goes to a
	// healthy READY endpoint instead, or waits for it if there is none.
	SlowStartWindow Duration `json:"slowStartWindow,omitempty"`
	// SlowStartAggression and SlowStartMinWeightPercent shape the ramp; 0
	// means the defaults of llmlb.SlowStart.
	SlowStartAggression       float64 `json:"slowStartAggression,omitempty"`
	SlowStartMinWeightPercent float64 `json:"slowStartMinWeightPercent,omitempty"`
	// OOBReportInterval, if positive, opens an out-of-band ORCA stream on
	// each READY connection that asks the server for a load report at this
	// interval (servers enforce their own minimum, 30 s by default in
	// grpc-go). 0 disables out-of-band reporting; per-call reports are
	// always read.
	OOBReportInterval Duration `json:"oobReportInterval,omitempty"`

	// Score is the score of "p2c" and "least-score": "requests" (default),
	// "tokens" or "kv".
	Score string `json:"score,omitempty"`
	// Bias is the active request bias of "weighted-least-request"; nil
	// means llmlb.DefaultActiveRequestBias.
	Bias *float64 `json:"bias,omitempty"`
	// HashBalance is the bounded-load factor of "consistent-hash" (0 means
	// llmlb.DefaultHashBalance).
	HashBalance float64 `json:"hashBalance,omitempty"`
	// RingReplicas is the number of ring points per endpoint of
	// "consistent-hash" and "prefix-hash" (0 means
	// llmlb.DefaultRingReplicas).
	RingReplicas int `json:"ringReplicas,omitempty"`
	// PrefixTokens and LoadFactor configure "prefix-hash" (0 means
	// llmlb.DefaultPrefixHashTokens and llmlb.DefaultPrefixHashLoadFactor).
	PrefixTokens int     `json:"prefixTokens,omitempty"`
	LoadFactor   float64 `json:"loadFactor,omitempty"`
	// BlockTokens is the number of prompt tokens per Request.Prefix hash for
	// the prefix-aware policies and "prefix-hash"; 0 means
	// prefix.DefaultBlockTokens.
	BlockTokens int `json:"blockTokens,omitempty"`
	// AbsThreshold, RelThreshold and MatchThreshold configure
	// "prefix-aware" and "sglang-cache-aware" (llmlb.PrefixAwareConfig).
	AbsThreshold   int     `json:"absThreshold,omitempty"`
	RelThreshold   float64 `json:"relThreshold,omitempty"`
	MatchThreshold float64 `json:"matchThreshold,omitempty"`
	// CacheWeight, FootprintWeight, KVPenalty, Sampled, Holders, Slots,
	// SlotWeight, OverloadWeight, OverloadQueue and DefaultQueueWeight
	// configure "default" (llmlb.DefaultConfig; 0 means its default); set
	// Slots to the engines' batch slots when they are few.
	CacheWeight        float64 `json:"cacheWeight,omitempty"`
	FootprintWeight    float64 `json:"footprintWeight,omitempty"`
	KVPenalty          float64 `json:"kvPenalty,omitempty"`
	Sampled            int     `json:"sampled,omitempty"`
	Holders            int     `json:"holders,omitempty"`
	Slots              int     `json:"slots,omitempty"`
	SlotWeight         float64 `json:"slotWeight,omitempty"`
	OverloadWeight     float64 `json:"overloadWeight,omitempty"`
	OverloadQueue      float64 `json:"overloadQueue,omitempty"`
	DefaultQueueWeight float64 `json:"defaultQueueWeight,omitempty"`
	// DisableLearning sets llmlb.DefaultConfig.DisableLearning for
	// "default": without it, each endpoint's prefill and decode speeds are
	// measured from its first tokens and completions and priced when the
	// replicas' speeds differ. It learns only from RPCs whose [Call]
	// reports its first token ([Call.FirstToken]); without one, "default"
	// prices as with learning off.
	DisableLearning bool `json:"disableLearning,omitempty"`
	// TTFTObjective and TPOTObjective set llmlb.DefaultConfig's
	// latency objectives for "default": given both, a cache miss also
	// costs the decode stall its prefill causes. Zero, the default,
	// prices none.
	TTFTObjective Duration `json:"ttftObjective,omitempty"`
	TPOTObjective Duration `json:"tpotObjective,omitempty"`
	// PeakDecay is the time constant of "peak-ewma"'s latency averages
	// (llmlb.PeakEWMAConfig.Decay); 0 means llmlb.DefaultPeakDecay. The
	// policy measures latency per output token from RPCs whose [Call]
	// reports its first token.
	PeakDecay Duration `json:"peakDecay,omitempty"`
	// QueueWeight, KVWeight and PrefixWeight configure "gie-default"
	// (llmlb.GIEConfig).
	QueueWeight  float64 `json:"queueWeight,omitempty"`
	KVWeight     float64 `json:"kvWeight,omitempty"`
	PrefixWeight float64 `json:"prefixWeight,omitempty"`
	// OverlapScoreWeight (Dynamo's overlap_score_weight, the weight of the
	// uncached prefill blocks against the decode blocks), DecayK,
	// ActiveWeight and Temperature override the published defaults of
	// "dynamo-kv" (llmlb.DynamoKVCostConfig) when set.
	OverlapScoreWeight *float64 `json:"overlapScoreWeight,omitempty"`
	DecayK             *float64 `json:"decayK,omitempty"`
	ActiveWeight       *float64 `json:"activeWeight,omitempty"`
	Temperature        *float64 `json:"temperature,omitempty"`

	// index and events are Options.Index and Options.Events of the builder
	// that parsed the config.
	index, events *prefix.Index
}

// Duration is a time.Duration written in JSON as a string such as "10s".
// It is a plain value, safe to use from any goroutine.
type Duration time.Duration

// UnmarshalJSON reads a duration string; negative durations are rejected.
// A JSON null leaves d unchanged, as it does other fields.
func (d *Duration) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		return nil
	}
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("duration must be a string such as \"10s\": %v", err)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		// Not err, which quotes all of s.
		return fmt.Errorf("duration %q is malformed or out of range (want a string such as \"10s\" or \"1.5s\")", truncate(s))
	}
	if v < 0 {
		return fmt.Errorf("duration %q is negative", truncate(s))
	}
	*d = Duration(v)
	return nil
}

// MarshalJSON writes the duration as a string.
func (d Duration) MarshalJSON() ([]byte, error) {
	return json.Marshal(time.Duration(d).String())
}

// commonParams are the config fields every policy accepts.
var commonParams = []string{"policy", "decodeAllowance", "maxSignalAge", "slowStartWindow",
	"slowStartAggression", "slowStartMinWeightPercent", "oobReportInterval"}

// policySpec maps a policy name to its parameters and constructor.
type policySpec struct {
	name   string
	params []string
	build  func(c *Config) (llmlb.Policy, error)
}

var policies = []policySpec{
	{"round-robin", nil, func(*Config) (llmlb.Policy, error) { return llmlb.RoundRobin(), nil }},
	{"random", nil, func(*Config) (llmlb.Policy, error) { return llmlb.Random(), nil }},
	{"least-outstanding", nil, func(*Config) (llmlb.Policy, error) { return llmlb.LeastOutstanding(), nil }},
	{"least-tokens", nil, func(*Config) (llmlb.Policy, error) { return llmlb.LeastTokens(), nil }},
	{"least-kv", nil, func(*Config) (llmlb.Policy, error) { return llmlb.LeastKV(), nil }},
	{"p2c", []string{"score"}, func(c *Config) (llmlb.Policy, error) {
		s, err := score(c.Score)
		return llmlb.P2C(s), err
	}},
	{"least-score", []string{"score"}, func(c *Config) (llmlb.Policy, error) {
		s, err := score(c.Score)
		return llmlb.LeastScore(s), err
	}},
	{"weighted-least-request", []string{"bias"}, func(c *Config) (llmlb.Policy, error) {
		bias := llmlb.DefaultActiveRequestBias
		if c.Bias != nil {
			bias = *c.Bias
		}
		return llmlb.WeightedLeastRequest(bias)
	}},
	{"consistent-hash", []string{"hashBalance", "ringReplicas"}, func(c *Config) (llmlb.Policy, error) {
		return llmlb.ConsistentHash(llmlb.HashConfig{Balance: c.HashBalance, Replicas: c.RingReplicas})
	}},
	{"prefix-hash", []string{"prefixTokens", "blockTokens", "loadFactor", "ringReplicas"}, func(c *Config) (llmlb.Policy, error) {
		return llmlb.PrefixHash(llmlb.PrefixHashConfig{PrefixTokens: c.PrefixTokens, BlockTokens: c.BlockTokens,
			LoadFactor: c.LoadFactor, Replicas: c.RingReplicas})
	}},
	{"prefix-aware", []string{"blockTokens", "absThreshold", "relThreshold", "matchThreshold"}, func(c *Config) (llmlb.Policy, error) {
		ix, err := index(c)
		if err != nil {
			return nil, err
		}
		return llmlb.PrefixAware(llmlb.PrefixAwareConfig{Index: ix, AbsThreshold: c.AbsThreshold,
			RelThreshold: c.RelThreshold, MatchThreshold: c.MatchThreshold})
	}},
	{"sglang-cache-aware", []string{"blockTokens", "absThreshold", "relThreshold", "matchThreshold"}, func(c *Config) (llmlb.Policy, error) {
		ix, err := index(c)
		if err != nil {
			return nil, err
		}
		return llmlb.SGLangCacheAware(llmlb.PrefixAwareConfig{Index: ix, AbsThreshold: c.AbsThreshold,
			RelThreshold: c.RelThreshold, MatchThreshold: c.MatchThreshold})
	}},
	{"dynamo-kv", []string{"blockTokens", "overlapScoreWeight", "decayK", "activeWeight", "temperature"}, func(c *Config) (llmlb.Policy, error) {
		ix, err := index(c)
		if err != nil {
			return nil, err
		}
		if c.events != nil { // Dynamo's router with workers that publish events
			if c.BlockTokens != 0 && c.BlockTokens != c.events.BlockSize() {
				return nil, fmt.Errorf("blockTokens %d differs from the block size %d of Options.Events", c.BlockTokens, c.events.BlockSize())
			}
			ix = c.events
		}
		kc := llmlb.DynamoKVCostConfig()
		kc.Index = ix
		// Dynamo's router tracks its active sequences' blocks by default.
		if kc.Active, err = llmlb.NewActiveBlocks(ix.BlockSize()); err != nil {
			return nil, err
		}
		for _, f := range []struct {
			src *float64
			dst *float64
		}{{c.OverlapScoreWeight, &kc.OverlapScoreWeight}, {c.DecayK, &kc.DecayK},
			{c.ActiveWeight, &kc.ActiveWeight}, {c.Temperature, &kc.Temperature}} {
			if f.src != nil {
				*f.dst = *f.src
			}
		}
		return llmlb.KVCost(kc)
	}},
	{"gie-default", []string{"blockTokens", "queueWeight", "kvWeight", "prefixWeight"}, func(c *Config) (llmlb.Policy, error) {
		ix, err := index(c)
		if err != nil {
			return nil, err
		}
		return llmlb.GIEDefault(llmlb.GIEConfig{Index: ix, QueueWeight: c.QueueWeight, KVWeight: c.KVWeight, PrefixWeight: c.PrefixWeight})
	}},
	{"peak-ewma", []string{"peakDecay"}, func(c *Config) (llmlb.Policy, error) {
		return llmlb.PeakEWMA(llmlb.PeakEWMAConfig{Decay: time.Duration(c.PeakDecay)})
	}},
	{DefaultPolicy, []string{"blockTokens", "cacheWeight", "footprintWeight", "kvPenalty", "sampled", "holders", "slots", "slotWeight", "overloadWeight", "overloadQueue", "defaultQueueWeight", "disableLearning", "ttftObjective", "tpotObjective"}, func(c *Config) (llmlb.Policy, error) {
		ix, err := index(c)
		if err != nil {
			return nil, err
		}
		return llmlb.Default(llmlb.DefaultConfig{Index: ix, Events: c.events, CacheWeight: c.CacheWeight, FootprintWeight: c.FootprintWeight,
			KVPenalty: c.KVPenalty, Sampled: c.Sampled, Holders: c.Holders, Slots: c.Slots, SlotWeight: c.SlotWeight,
			OverloadWeight: c.OverloadWeight, OverloadQueue: c.OverloadQueue, QueueWeight: c.DefaultQueueWeight, DisableLearning: c.DisableLearning,
			TTFTObjective: time.Duration(c.TTFTObjective), TPOTObjective: time.Duration(c.TPOTObjective)})
	}},
}

// Policies returns the names of the policies a Config may select, sorted.
func Policies() []string {
	out := make([]string, len(policies))
	for i, p := range policies {
		out[i] = p.name
	}
	sort.Strings(out)
	return out
}

func lookup(name string) (*policySpec, bool) {
	for i := range policies {
		if policies[i].name == name {
			return &policies[i], true
		}
	}
	return nil, false
}

func score(name string) (llmlb.Score, error) {
	switch name {
	case "", "requests":
		return llmlb.RequestsScore, nil
	case "tokens":
		return llmlb.TokensScore, nil
	case "kv":
		return llmlb.KVScore, nil
	}
	return nil, fmt.Errorf("unknown score %q (want requests, tokens or kv)", truncate(name))
}

// index returns the builder's prefix index, or a new one for the block
// size of c.
func index(c *Config) (*prefix.Index, error) {
	if c.BlockTokens < 0 {
		return nil, fmt.Errorf("blockTokens %d is negative", c.BlockTokens)
	}
	if c.index != nil {
		if c.BlockTokens != 0 && c.BlockTokens != c.index.BlockSize() {
			return nil, fmt.Errorf("blockTokens %d differs from the block size %d of Options.Index", c.BlockTokens, c.index.BlockSize())
		}
		return c.index, nil
	}
	return prefix.NewIndex(prefix.IndexConfig{BlockSize: c.BlockTokens})
}

// parseConfig parses and validates a balancer config. It builds the policy
// and the balancer options once to validate them; Build builds its own.
func parseConfig(js []byte, ix, events *prefix.Index) (*Config, error) {
	if len(js) > maxConfigBytes {
		return nil, fmt.Errorf("%w: config is %d bytes, above %d", ErrInvalidConfig, len(js), maxConfigBytes)
	}
	cfg := &Config{index: ix, events: events}
	trimmed := bytes.TrimSpace(js)
	if len(trimmed) == 0 || bytes.Equal(trimmed, []byte("null")) {
		cfg.Policy = DefaultPolicy
		return cfg, nil
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(trimmed, &fields); err != nil {
		return nil, fmt.Errorf("%w: config must be a JSON object: %v", ErrInvalidConfig, err)
	}
	name := DefaultPolicy
	if raw, ok := fields["policy"]; ok {
		if err := json.Unmarshal(raw, &name); err != nil {
			return nil, fmt.Errorf("%w: policy must be a string: %v", ErrInvalidConfig, err)
		}
		if name == "" {
			name = DefaultPolicy
		}
	}
	spec, ok := lookup(name)
	if !ok {
		return nil, fmt.Errorf("%w: unknown policy %q (want one of %s)", ErrInvalidConfig, truncate(name), strings.Join(Policies(), ", "))
	}
	keys := make([]string, 0, len(fields))
	for k := range fields {
		keys = append(keys, k)
	}
	sort.Strings(keys) // report the same error for the same config
	for _, k := range keys {
		switch {
		case slices.Contains(commonParams, k) || slices.Contains(spec.params, k):
		case !knownParam(k):
			return nil, fmt.Errorf("%w: unknown parameter %q", ErrInvalidConfig, truncate(k))
		default:
			return nil, fmt.Errorf("%w: parameter %q does not apply to policy %q (it takes %s)",
				ErrInvalidConfig, k, spec.name, paramList(spec.params))
		}
	}
	dec := json.NewDecoder(bytes.NewReader(trimmed))
	dec.DisallowUnknownFields()
	if err := dec.Decode(cfg); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Type != nil {
			// Not err, which quotes the whole of a number that does not fit.
			kind, _, _ := strings.Cut(te.Value, " ")
			return nil, fmt.Errorf("%w: parameter %q: a JSON %s does not fit %s", ErrInvalidConfig, truncate(te.Field), kind,
				strings.TrimPrefix(te.Type.String(), "*"))
		}
		return nil, fmt.Errorf("%w: %v", ErrInvalidConfig, err)
	}
	cfg.Policy = name
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return cfg, nil
}

// knownParam reports whether some policy takes the parameter name.
func knownParam(name string) bool {
	for _, p := range policies {
		if slices.Contains(p.params, name) {
			return true
		}
	}
	return false
}

func paramList(ps []string) string {
	if len(ps) == 0 {
		return "no parameters of its own"
	}
	return strings.Join(ps, ", ")
}

// validate builds the policy and the options of c once.
func (c *Config) validate() error {
	for _, f := range []struct {
		name string
		v    float64
	}{{"slowStartAggression", c.SlowStartAggression}, {"slowStartMinWeightPercent", c.SlowStartMinWeightPercent}} {
		if math.IsNaN(f.v) || math.IsInf(f.v, 0) || f.v < 0 {
			return fmt.Errorf("%w: %s %v must be finite and non-negative", ErrInvalidConfig, f.name, f.v)
		}
	}
	if _, err := c.newPolicy(); err != nil {
		return err
	}
	if _, err := llmlb.New(llmlb.RoundRobin(), c.options()...); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	if c.SlowStartWindow == 0 && (c.SlowStartAggression != 0 || c.SlowStartMinWeightPercent != 0) {
		// Unused without a window, the ramp is still checked: a value out
		// of range is an error whether or not slow start is on.
		ramp := llmlb.SlowStart{Window: time.Second, Aggression: c.SlowStartAggression, MinWeightPercent: c.SlowStartMinWeightPercent}
		if _, err := llmlb.New(llmlb.RoundRobin(), llmlb.WithSlowStart(ramp)); err != nil {
			return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
		}
	}
	return nil
}

// spec returns the name of c's policy (DefaultPolicy if unset) and its
// spec, or an error wrapping ErrInvalidConfig if there is none.
func (c *Config) spec() (string, *policySpec, error) {
	name := c.Policy
	if name == "" {
		name = DefaultPolicy
	}
	spec, ok := lookup(name)
	if !ok {
		return name, spec, fmt.Errorf("%w: unknown policy %q", ErrInvalidConfig, truncate(name))
	}
	return name, spec, nil
}

// newPolicy builds a new policy for c.
func (c *Config) newPolicy() (llmlb.Policy, error) {
	name, spec, err := c.spec()
	if err != nil {
		return nil, err
	}
	p, err := spec.build(c)
	if err != nil {
		return nil, fmt.Errorf("%w: policy %q: %w", ErrInvalidConfig, name, err)
	}
	return p, nil
}

// options returns the balancer options of c, except the signal, clock and
// randomness, which come from the builder.
func (c *Config) options() []llmlb.Option {
	var opts []llmlb.Option
	if c.DecodeAllowance != nil {
		opts = append(opts, llmlb.WithDecodeAllowance(*c.DecodeAllowance))
	}
	if c.SlowStartWindow > 0 {
		opts = append(opts, llmlb.WithSlowStart(llmlb.SlowStart{Window: time.Duration(c.SlowStartWindow),
			Aggression: c.SlowStartAggression, MinWeightPercent: c.SlowStartMinWeightPercent}))
	}
	return opts
}

// sameBalancer reports whether c and o build the same balancer: a config
// update that builds an equivalent one keeps the channel's llmlb.Balancer,
// and with it the accounting of the RPCs in flight, its members' health
// and slow start. grpc-go's least_request keeps its in-flight counts across
// a config update likewise (balancer/leastrequest/leastrequest.go,
// UpdateClientConnState, grpc-go v1.85.0). The configs are compared on
// what builds the balancer (see balancerKey).
func (c *Config) sameBalancer(o *Config) bool {
	if c == nil || o == nil {
		return c == o
	}
	ka, err1 := c.balancerKey()
	kb, err2 := o.balancerKey()
	return err1 == nil && err2 == nil && bytes.Equal(ka, kb)
}

// balancerKey returns the parameters c builds its balancer from, as JSON:
// the policy and the parameters it and the balancer read, each that is
// set to its documented default left out as if unset. So two configs
// have the same key when one sets a parameter to its default and the other
// leaves it out, when they differ only in out-of-band reporting (the
// adapter's, not the balancer's), in the ramp of a slow start that neither
// enables, or in parameters the policy does not read (which only a Config
// built in Go, not parsed, can carry). The index and events indexes are
// the builder's, the same for every config it parses.
func (c *Config) balancerKey() ([]byte, error) {
	name, spec, err := c.spec()
	if err != nil {
		return nil, err
	}
	js, err := json.Marshal(c)
	if err != nil {
		return nil, err
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(js, &fields); err != nil {
		return nil, err
	}
	fields["policy"], _ = json.Marshal(name)
	delete(fields, "oobReportInterval")
	if name == "dynamo-kv" && c.events != nil {
		delete(fields, "blockTokens") // it reads the events index instead
	}
	if c.SlowStartWindow == 0 {
		delete(fields, "slowStartAggression")
		delete(fields, "slowStartMinWeightPercent")
	}
	for k := range fields {
		if !slices.Contains(commonParams, k) && !slices.Contains(spec.params, k) {
			delete(fields, k)
		}
	}
	for k, v := range c.paramDefaults(name) {
		if d, err := json.Marshal(v); err == nil && bytes.Equal(fields[k], d) {
			delete(fields, k)
		}
	}
	return json.Marshal(fields) // sorted keys
}

// paramDefaults returns, by parameter, the value that the policy name of c
// and the balancer read a parameter's zero value as, where it is a
// documented default of package llmlb or prefix.
func (c *Config) paramDefaults(name string) map[string]any {
	d := map[string]any{
		"decodeAllowance": llmlb.DefaultDecodeAllowance,
		"maxSignalAge":    Duration(llmlb.DefaultMaxSignalAge),
		"score":           "requests",
		"bias":            llmlb.DefaultActiveRequestBias,
		"hashBalance":     llmlb.DefaultHashBalance,
		"ringReplicas":    llmlb.DefaultRingReplicas,
		"prefixTokens":    llmlb.DefaultPrefixHashTokens,
		"loadFactor":      llmlb.DefaultPrefixHashLoadFactor,
		"absThreshold":    llmlb.DefaultBalanceAbsThreshold,
		"relThreshold":    llmlb.DefaultBalanceRelThreshold,
		"matchThreshold":  llmlb.DefaultMatchThreshold,
		"peakDecay":       Duration(llmlb.DefaultPeakDecay),
	}
	switch {
	case name == "prefix-hash":
		d["blockTokens"] = llmlb.DefaultBlockTokens
	case name == "dynamo-kv" && c.events != nil:
		// Its index is the events index, whatever blockTokens says (see
		// balancerKey).
	case c.index != nil:
		d["blockTokens"] = c.index.BlockSize()
	default:
		d["blockTokens"] = prefix.DefaultBlockTokens
	}
	return d
}

func truncate(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}
