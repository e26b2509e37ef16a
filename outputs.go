package llmlb

import (
	"fmt"
	"math"
	"math/bits"
	"sync"
	"sync/atomic"

	"github.com/cespare/xxhash/v2"
	lru "github.com/hashicorp/golang-lru/v2"
)

// Defaults of [OutputConfig].
const (
	// DefaultOutputMinObservations is the default
	// [OutputConfig.MinObservations].
	DefaultOutputMinObservations = 16
	// DefaultOutputWindow is the default [OutputConfig.Window].
	DefaultOutputWindow = 256
	// DefaultOutputMaxKinds is the default [OutputConfig.MaxKinds].
	DefaultOutputMaxKinds = 4096
)

// OutputConfig configures output-length prediction ([WithOutputPrediction]).
// The zero value selects every default.
type OutputConfig struct {
	// Quantile, if in (0, 1), is the quantile of a kind's learned output
	// lengths charged as a request's decode work: above 0.5 it charges
	// long generations more surely, for engines whose KV cache is tight.
	// 0 charges the mean, the expected decode work, which is what a
	// balance of work needs.
	Quantile float64
	// MinObservations is the completions of a kind of request needed
	// before its lengths are used; until then the next broader kind's are
	// (see [WithOutputPrediction]), and with none, the decode allowance. 0
	// means [DefaultOutputMinObservations].
	MinObservations int
	// Window is about how many of a kind's latest completions its learned
	// lengths reflect: each new one weighs 1/Window, and older ones decay
	// geometrically, so a kind whose outputs change is followed. 0 means
	// [DefaultOutputWindow]; 1 counts as 2.
	Window int
	// MaxKinds bounds the kinds remembered (tenant and feature pairs, and
	// features), the least recently completed forgotten first. Each takes
	// about 1 KiB. 0 means [DefaultOutputMaxKinds].
	MaxKinds int
}

// WithOutputPrediction has the balancer learn the output lengths of its
// requests and charge each request whose OutputTokens is 0 the learned
// length of its kind as decode work, instead of the fixed decode allowance
// ([WithDecodeAllowance]); MaxTokens still caps it. A request's
// MaxTokens is a ceiling, not a forecast, and output lengths are
// heavy-tailed and differ by route, prompt template and tenant by orders of
// magnitude.
//
// A kind is the pair of [Request.Tenant] and [Request.Feature]; a kind with
// fewer than MinObservations completions is charged the lengths learned
// for its Feature over all tenants, then over all requests, then the
// allowance. The lengths are learned from the completions of requests
// that streamed to their end ([Pick.Done] with a nil error after
// [Pick.FirstToken]) and reported their output tokens with
// [Pick.Generated]: a request that failed or was cancelled ended early and
// would teach a length too short. A caller's own estimate
// ([Request.OutputTokens], such as an agent framework's hint) is charged
// as given, and its completion still teaches its kind.
//
// Picks do not allocate: the learned length of each kind is kept ready
// when its completions are recorded, which costs a few hundred nanoseconds
// on Done. A balancer's kinds are its own; their memory is bounded by
// MaxKinds.
func WithOutputPrediction(cfg OutputConfig) Option {
	return optionFunc(func(c *config) error {
		p, err := newOutputPredictor(cfg)
		if err != nil {
			return err
		}
		c.outputs = p
		return nil
	})
}

// outputBuckets is the number of buckets of an output-length histogram:
// lengths 0 and 1, then four per octave up to 2^31 tokens.
const outputBuckets = 2 + 4*31

// outputBucket returns the histogram bucket of an output of n tokens.
func outputBucket(n int64) int {
	if n <= 1 {
		return int(max(n, 0))
	}
	o := bits.Len64(uint64(n)) - 1 // octave: 2^o <= n < 2^(o+1)
	sub := 0
	if o >= 2 {
		sub = int(n>>(o-2)) & 3
	} else {
		sub = int(n<<(2-o)) & 3
	}
	return min(2+4*(o-1)+sub, outputBuckets-1)
}

// outputBucketValue returns the length a bucket stands for: the geometric
// middle of its range.
func outputBucketValue(b int) float64 {
	if b < 2 {
		return float64(b)
	}
	o, sub := (b-2)/4+1, (b-2)%4
	lo := math.Ldexp(1+float64(sub)/4, o)
	hi := math.Ldexp(1+float64(sub+1)/4, o)
	return math.Sqrt(lo * hi)
}

// outputDist is the learned output lengths of one kind of request.
// Completion k weighs g^k, g = 1/(1-1/Window), so that relative to the
// newest each older one has decayed geometrically, without touching the
// others on each completion; the weights are scaled down when they grow
// large.
type outputDist struct {
	mu     sync.Mutex
	counts [outputBuckets]float64 // weights of the completions per bucket
	weight float64                // their sum
	sum    float64                // the lengths' weighted sum, for the mean
	next   float64                // the weight of the next completion
	n      atomic.Int64           // completions seen (not decayed)
	est    atomic.Int64           // the charged length, kept ready for picks
}

// observe adds a completion of n output tokens and updates the estimate.
func (d *outputDist) observe(n int64, p *outputPredictor) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.next == 0 {
		d.next = 1
	}
	w := d.next
	d.counts[outputBucket(n)] += w
	d.weight += w
	d.sum += w * float64(n)
	d.next *= p.growth
	if d.next > 1e100 {
		for i := range d.counts {
			d.counts[i] /= d.next
		}
		d.weight, d.sum, d.next = d.weight/d.next, d.sum/d.next, 1
	}
	var est float64
	if p.quantile == 0 {
		est = d.sum / d.weight
	} else {
		// The buckets' sum may round below the weight: the quantile is
		// then the last bucket that holds any.
		target, acc, b := p.quantile*d.weight, 0.0, 0
		for i, c := range d.counts {
			if c == 0 {
				continue
			}
			b = i
			if acc += c; acc >= target {
				break
			}
		}
		est = outputBucketValue(b)
	}
	d.est.Store(int64(math.Round(min(max(est, 1), math.MaxInt32))))
	d.n.Add(1)
}

// outputPredictor learns output lengths per kind (see WithOutputPrediction).
type outputPredictor struct {
	quantile float64
	minObs   int64
	growth   float64 // 1/(1-1/Window): the weight of a completion over the one before
	kinds    *lru.Cache[uint64, *outputDist]
	all      outputDist
	mu       sync.Mutex // serializes adding kinds
}

func newOutputPredictor(cfg OutputConfig) (*outputPredictor, error) {
	switch {
	case !(cfg.Quantile >= 0 && cfg.Quantile < 1):
		return nil, fmt.Errorf("%w: output prediction quantile %v out of [0, 1)", ErrInvalidOption, cfg.Quantile)
	case cfg.MinObservations < 0 || cfg.Window < 0 || cfg.MaxKinds < 0:
		return nil, fmt.Errorf("%w: output prediction MinObservations %d, Window %d and MaxKinds %d must not be negative",
			ErrInvalidOption, cfg.MinObservations, cfg.Window, cfg.MaxKinds)
	}
	if cfg.MinObservations == 0 {
		cfg.MinObservations = DefaultOutputMinObservations
	}
	if cfg.Window == 0 {
		cfg.Window = DefaultOutputWindow
	}
	if cfg.MaxKinds == 0 {
		cfg.MaxKinds = DefaultOutputMaxKinds
	}
	kinds, err := lru.New[uint64, *outputDist](cfg.MaxKinds)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidOption, err)
	}
	return &outputPredictor{
		quantile: cfg.Quantile,
		minObs:   int64(cfg.MinObservations),
		growth:   1 / (1 - 1/float64(max(cfg.Window, 2))),
		kinds:    kinds,
	}, nil
}

// outputKeys returns the keys of r's kind and of its feature.
func outputKeys(r *Request) (kind, feature uint64) {
	f := xxhash.Sum64String(r.Feature)
	return mix64(xxhash.Sum64String(r.Tenant)^mix64(f)) | 1, mix64(f+0x9e3779b97f4a7c15) &^ 1
}

// estimate returns the learned length charged for a request of the kind
// and feature keys, or 0 if none is known well enough.
func (p *outputPredictor) estimate(kind, feature uint64) int64 {
	for _, k := range [2]uint64{kind, feature} {
		if d, ok := p.kinds.Peek(k); ok && d.n.Load() >= p.minObs {
			return d.est.Load()
		}
	}
	if p.all.n.Load() >= p.minObs {
		return p.all.est.Load()
	}
	return 0
}

// observe records a completion of n output tokens of the kind and feature.
func (p *outputPredictor) observe(kind, feature uint64, n int64) {
	for _, k := range [2]uint64{kind, feature} {
		d, ok := p.kinds.Get(k)
		if !ok {
			p.mu.Lock()
			if d, ok = p.kinds.Get(k); !ok {
				d = new(outputDist)
				p.kinds.Add(k, d)
			}
			p.mu.Unlock()
		}
		d.observe(n, p)
	}
	p.all.observe(n, p)
}
