package sim

import (
	"cmp"
	"container/heap"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/llmlb/llmlb/fair"
)

// Request is one request of a workload.
type Request struct {
	// Arrival is when the request arrives, from the start of the run.
	Arrival time.Duration
	// PromptTokens and OutputTokens are the true prompt and output lengths,
	// from 1 to [MaxPromptTokens] and [MaxOutputTokens]. Routers are told
	// the prompt length only.
	PromptTokens int
	OutputTokens int
	// BlockTokens is the number of prompt tokens each Prefix hash covers; it
	// is a multiple of the engine block size when Prefix is set.
	BlockTokens int
	// Prefix holds the chained hashes of the prompt's blocks: Prefix[i]
	// covers tokens [i*BlockTokens, (i+1)*BlockTokens) and depends on every
	// block before it, so equal hashes mean equal prefixes. The last hash may
	// cover a partial block; only full blocks are cached. nil means the
	// prompt shares nothing.
	Prefix []uint64
	// Reply holds the chained hashes of the blocks the engine caches when
	// the request completes, beyond the prompt's full blocks: those of the
	// prompt's partial tail followed by the output, continuing Prefix's
	// chain, as vLLM and SGLang cache generated tokens too. The next turn of
	// a conversation starts with Prefix's full blocks and Reply. nil means
	// the output is not cached for reuse.
	Reply []uint64
	// Session is the conversation key of a multi-turn request, passed to
	// routers as the affinity key; empty for single requests.
	Session string
	// Tenant is the principal the request is served for, whose share
	// [Config.Admission] controls and the results report ([Result].Tenants);
	// "" is a tenant like any other.
	Tenant string
	// Route is the kind of request, such as the API route or the prompt
	// template, whose outputs have alike lengths ([Synthetic].Routes);
	// routers are told it as [llmlb.Request].Feature. Empty for a workload
	// without routes.
	Route string
	// Class is the request's priority class, by which a [FairQueue]
	// admission orders the waiting requests; the zero value is
	// [fair.Standard].
	Class fair.Class
	// Adapter names the request's LoRA adapter ([Synthetic].Adapters),
	// passed to routers as [llmlb.Request].Adapter; "" is the base model.
	Adapter string
}

// ChainHash returns the chained hash of a block whose identity is id and
// whose predecessor's chained hash is prev (0 for the first block). It is
// SplitMix64's finalizer over both words, so equal chains give equal hashes
// and any difference in an earlier block changes every later hash.
func ChainHash(prev, id uint64) uint64 {
	return mix64(prev*0x9e3779b97f4a7c15 ^ mix64(id+0x632be59bd9b4e019))
}

func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// validateRequests checks a workload against an engine block size.
func validateRequests(reqs []Request, blockSize int) error {
	var last time.Duration
	for i := range reqs {
		r := &reqs[i]
		switch {
		case r.Arrival < 0 || r.Arrival < last:
			return fmt.Errorf("%w: request %d arrives at %v, before %v", ErrInvalidWorkload, i, r.Arrival, last)
		case r.PromptTokens < 1 || r.PromptTokens > MaxPromptTokens:
			return fmt.Errorf("%w: request %d has %d prompt tokens, want 1 to %d", ErrInvalidWorkload, i, r.PromptTokens, MaxPromptTokens)
		case r.OutputTokens < 1 || r.OutputTokens > MaxOutputTokens:
			return fmt.Errorf("%w: request %d has %d output tokens, want 1 to %d", ErrInvalidWorkload, i, r.OutputTokens, MaxOutputTokens)
		case (len(r.Prefix) > 0 || len(r.Reply) > 0) && (r.BlockTokens < blockSize || r.BlockTokens%blockSize != 0):
			return fmt.Errorf("%w: request %d has %d tokens per prefix hash; want a multiple of the block size %d", ErrInvalidWorkload, i, r.BlockTokens, blockSize)
		}
		last = r.Arrival
	}
	return nil
}

// maxTokens bounds token counts so that sums cannot overflow.
const maxTokens = 1 << 24

// Bounds on a request's lengths, enforced on [Request]s, traces and
// [Synthetic] workloads. A replica iterates once per output token, so a
// run's simulated span and running time grow with the longest output; its
// memory does not, since the simulator keeps no state per output token.
const (
	// MaxPromptTokens is the longest prompt, 2^24 tokens.
	MaxPromptTokens = maxTokens
	// MaxOutputTokens is the longest output, 2^20 tokens: about a million
	// iterations of one replica, hours of simulated time.
	MaxOutputTokens = 1 << 20
)

// Synthetic describes a generated workload. Its zero value is not useful:
// start from [DefaultSynthetic] or [PrefixSynthetic] and change fields.
// Every arrival is one of: a follow-up turn, either of a recent multi-turn
// session (SessionShare) or of a conversation paced by its replies (Turns),
// the start of an agent fan-out burst (FanoutShare), or a fresh request,
// which starts with one of PrefixGroups shared prefixes with probability
// PrefixShare. Generate only reads it and may be called concurrently.
type Synthetic struct {
	// Requests is the number of requests generated.
	Requests int
	// Rate is the mean arrival rate in requests per second (agent bursts
	// included). Requests/Rate must not exceed 1e9 seconds.
	Rate float64
	// ArrivalCV is the coefficient of variation of inter-arrival times: 1
	// gives Poisson arrivals, larger values burstier Gamma arrivals. 0 means 1.
	ArrivalCV float64
	// Prompt and Output are the length distributions of fresh text (the
	// unique part of a prompt, a new message, an output). Output.Max is at
	// most [MaxOutputTokens]. With Routes, each route's Output takes the
	// place of Output.
	Prompt, Output LogNormal
	// BlockTokens is the number of tokens per prefix hash, a multiple of the
	// engine block size. 0 means 64.
	BlockTokens int
	// PrefixShare is the probability that a fresh request starts with a
	// shared prefix; PrefixGroups is the number of shared prefixes, drawn with
	// Zipf popularity of exponent PrefixZipf (> 1), each PrefixTokens long.
	PrefixShare  float64
	PrefixGroups int
	// PrefixZipf is the exponent of the Zipf popularity of the shared
	// prefixes: a fresh request that starts with one picks prefix k with
	// probability proportional to (1+k)^-PrefixZipf. It must exceed 1 when
	// PrefixShare is positive; larger values concentrate the requests on
	// fewer prefixes.
	PrefixZipf float64
	// PrefixTokens is the length distribution of each shared prefix, drawn
	// once per prefix, and of the parent prefix of each agent burst; either
	// is rounded up to whole blocks of BlockTokens. A follow-up turn whose
	// prompt would exceed Prompt.Max + PrefixTokens.Max tokens drops the
	// conversation's history and carries its new message only.
	PrefixTokens LogNormal
	// SessionShare is the probability that an arrival is the next turn of one
	// of the last Sessions conversations; its prompt is the previous prompt
	// plus the previous reply plus a new message. The turn may arrive before
	// the previous reply ends, as in an agent's tight loop, so the reply is
	// not reused from cache; see Turns for conversations paced by replies.
	SessionShare float64
	Sessions     int
	// Turns, if positive, switches to paced conversations in place of
	// SessionShare: every fresh request starts a conversation of a
	// geometric number of turns with mean Turns (at least 1), and each next
	// turn arrives after the previous reply (40 ms per output token) plus
	// an exponential pause of mean ThinkTime. Fresh requests then arrive at
	// Rate/Turns, so that all requests arrive at about Rate. Every turn
	// carries its Reply, which the engines cache, so a turn on the replica
	// that served the previous one reuses the whole history; the children
	// of agent bursts, which no turn follows, carry none.
	Turns     float64
	ThinkTime time.Duration
	// FanoutShare is the probability that an arrival starts an agent burst of
	// FanoutSize requests arriving within a few milliseconds that share a new
	// parent prefix of PrefixTokens.
	FanoutShare float64
	FanoutSize  int
	// Tenants, if not empty, splits the workload among tenants: each
	// generates its Share of Requests (rounded, at least one) at its Share
	// of Rate, as a workload of its own with the other fields (its own
	// shared prefixes and conversations) from a seed of its own, and its
	// requests carry its Name as [Request].Tenant. The tenants' requests
	// are merged in arrival order.
	Tenants []TenantShare
	// Routes, if not empty, splits the requests among kinds whose outputs
	// differ (see [Route]): each fresh request, agent bursts' children
	// included, is of a route drawn by share, and every later turn of its
	// conversation is of the same route. Empty means every output is drawn
	// from Output and no request has a route.
	Routes []Route
	// Adapters, if positive, serves every conversation (all its turns)
	// and every agent burst with one of Adapters LoRA adapters, "lora-0"
	// to "lora-<Adapters-1>", drawn with Zipf popularity of exponent
	// AdapterZipf (> 1): adapter k with probability proportional to
	// (1+k)^-AdapterZipf. A shared prefix served with an adapter is cached
	// apart from the same prefix under another one. 0 means the base model
	// only.
	Adapters    int
	AdapterZipf float64
	// Branches, if above 1 with Turns, makes every conversation an agent
	// whose every step fans out into Branches parallel requests a few
	// milliseconds apart, each the whole history plus a short branch
	// message of its own (a quarter of a Prompt draw, as a follow-up
	// turn's). The next step arrives after the longest branch's reply and a
	// pause, and its history is the previous history plus every branch's
	// reply, merged into new blocks. Turns is then the mean number of
	// steps, and Rate counts every branch. 0 or 1 means one request per
	// turn.
	Branches int
	// Documents, if positive, makes every fresh request
	// retrieval-augmented: after its shared prefix, if it has one, its
	// prompt carries Retrieved distinct documents of a corpus of
	// Documents, drawn with Zipf popularity of exponent DocumentZipf (> 1)
	// and placed in the order drawn, before its new message. Each document
	// is DocumentTokens long, drawn once per document and rounded up to
	// whole blocks, so two prompts share a cached head up to the first
	// document in which they differ.
	Documents      int
	DocumentZipf   float64
	DocumentTokens LogNormal
	Retrieved      int
	// Cycle varies the arrival rate over time, with Rate as its mean: of
	// every arrival, or with Turns of fresh conversations, whose next turns
	// follow their replies. Its zero value keeps the rate steady.
	Cycle LoadCycle
}

// LogNormal is a log-normal length distribution with the given median and
// shape sigma, clamped to [Min, Max].
type LogNormal struct {
	// Median is the median length in tokens, positive; Sigma, at least 0,
	// is the standard deviation of the length's natural logarithm: 0 draws
	// Median every time, larger values give heavier tails.
	Median, Sigma float64
	// Min and Max bound every length drawn: 1 <= Min <= Max <=
	// [MaxPromptTokens] (Max <= [MaxOutputTokens] for output lengths).
	Min, Max int
}

func (d LogNormal) sample(r *rand.Rand) int {
	x := d.Median * math.Exp(d.Sigma*r.NormFloat64())
	return int(min(max(x, float64(d.Min)), float64(d.Max)))
}

// validate checks d, whose lengths must not exceed limit.
func (d LogNormal) validate(name string, limit int) error {
	if !(d.Median > 0) || math.IsInf(d.Median, 0) || !(d.Sigma >= 0) || math.IsInf(d.Sigma, 0) || d.Min < 1 || d.Max < d.Min || d.Max > limit {
		return fmt.Errorf("%w: %s distribution %+v: want median > 0, sigma >= 0, 1 <= min <= max <= %d", ErrInvalidWorkload, name, d, limit)
	}
	return nil
}

// DefaultSynthetic returns the workload of the default scenario: the
// lengths of [PrefixSynthetic], but conversations paced by their replies
// (Turns): every fresh request starts a conversation of 4 turns on average,
// each next turn arriving after the reply plus a pause of 5 s on average, so
// three requests in four continue a conversation whose whole history, reply
// included, only the replica that served the previous turn holds; 20% of
// fresh requests start with one of 32 shared prefixes, and 1% start an agent
// burst. rate is the long-run request rate; a run starts with fewer
// conversations under way, so its mean rate is somewhat lower.
func DefaultSynthetic(n int, rate float64) Synthetic {
	w := PrefixSynthetic(n, rate)
	w.SessionShare, w.Sessions, w.PrefixShare = 0, 0, 0.2
	w.Turns, w.ThinkTime = 4, 5*time.Second
	return w
}

// PrefixSynthetic returns the workload of the prefixes scenario: n requests
// at rate requests per second, Poisson arrivals, log-normal prompts (median
// 1000 tokens, capped at 16k) and outputs (median 150, capped at 2k), 60% of
// fresh requests starting with one of 32 shared prefixes (Zipf 1.1, median
// 1500 tokens), 15% of arrivals continuing one of 64 recent sessions and 1%
// starting an agent burst of 8.
func PrefixSynthetic(n int, rate float64) Synthetic {
	return Synthetic{
		Requests:     n,
		Rate:         rate,
		ArrivalCV:    1,
		Prompt:       LogNormal{Median: 1000, Sigma: 1.0, Min: 16, Max: 16384},
		Output:       LogNormal{Median: 150, Sigma: 0.9, Min: 2, Max: 2048},
		BlockTokens:  64,
		PrefixShare:  0.6,
		PrefixGroups: 32,
		PrefixZipf:   1.1,
		PrefixTokens: LogNormal{Median: 1500, Sigma: 0.5, Min: 256, Max: 8192},
		SessionShare: 0.15,
		Sessions:     64,
		FanoutShare:  0.01,
		FanoutSize:   8,
	}
}

func (s *Synthetic) validate() error {
	switch {
	case s.Requests < 1:
		return fmt.Errorf("%w: %d requests", ErrInvalidWorkload, s.Requests)
	case !(s.Rate > 0) || math.IsInf(s.Rate, 0):
		return fmt.Errorf("%w: rate %v", ErrInvalidWorkload, s.Rate)
	case float64(s.Requests)/s.Rate > maxTraceSeconds:
		return fmt.Errorf("%w: rate %.3g requests/s spreads %d requests over more than %gs", ErrInvalidWorkload, s.Rate, s.Requests, float64(maxTraceSeconds))
	case s.ArrivalCV < 0 || math.IsNaN(s.ArrivalCV) || math.IsInf(s.ArrivalCV, 0):
		return fmt.Errorf("%w: arrival CV %v", ErrInvalidWorkload, s.ArrivalCV)
	case s.BlockTokens < 0:
		return fmt.Errorf("%w: block tokens %d", ErrInvalidWorkload, s.BlockTokens)
	case !inUnit(s.PrefixShare) || !inUnit(s.SessionShare) || !inUnit(s.FanoutShare) || s.SessionShare+s.FanoutShare > 1:
		return fmt.Errorf("%w: shares must be in [0, 1] (session + fanout <= 1)", ErrInvalidWorkload)
	case s.PrefixShare > 0 && (s.PrefixGroups < 1 || !(s.PrefixZipf > 1)):
		return fmt.Errorf("%w: prefix groups %d, zipf %v: want >= 1 and > 1", ErrInvalidWorkload, s.PrefixGroups, s.PrefixZipf)
	case s.Turns != 0 && !(s.Turns >= 1 && s.Turns <= 1e6):
		return fmt.Errorf("%w: %v turns per conversation: want 0 or in [1, 1e6]", ErrInvalidWorkload, s.Turns)
	case s.ThinkTime < 0:
		return fmt.Errorf("%w: think time %v", ErrInvalidWorkload, s.ThinkTime)
	case s.Turns > 0 && s.SessionShare > 0:
		return fmt.Errorf("%w: Turns paces conversations in place of SessionShare; set one", ErrInvalidWorkload)
	case s.SessionShare > 0 && s.Sessions < 1:
		return fmt.Errorf("%w: %d sessions", ErrInvalidWorkload, s.Sessions)
	case s.FanoutShare > 0 && s.FanoutSize < 1:
		return fmt.Errorf("%w: fan-out size %d", ErrInvalidWorkload, s.FanoutSize)
	}
	if err := s.Prompt.validate("prompt", MaxPromptTokens); err != nil {
		return err
	}
	if err := s.Output.validate("output", MaxOutputTokens); err != nil {
		return err
	}
	if s.PrefixShare > 0 || s.FanoutShare > 0 {
		if err := s.PrefixTokens.validate("prefix", MaxPromptTokens); err != nil {
			return err
		}
	}
	if err := validateRoutes(s.Routes); err != nil {
		return err
	}
	if err := s.validateAdapters(); err != nil {
		return err
	}
	if err := s.validateFamilies(); err != nil {
		return err
	}
	return validateTenants(s.Tenants)
}

func inUnit(x float64) bool { return x >= 0 && x <= 1 }

// session is the state of a multi-turn conversation.
type session struct {
	key     string
	prompt  int           // tokens of the last prompt plus its reply
	hashes  []uint64      // chained hashes of the full blocks of those tokens
	ready   time.Duration // paced conversations: when the next turn arrives
	route   string        // the route of its turns (Synthetic.Routes)
	adapter string        // the adapter of its turns (Synthetic.Adapters)
}

// Generate returns the requests of s, deterministic for seed.
func (s Synthetic) Generate(seed uint64) ([]Request, error) {
	if err := s.validate(); err != nil {
		return nil, err
	}
	if len(s.Tenants) > 0 {
		return s.generateTenants(seed)
	}
	if s.ArrivalCV == 0 {
		s.ArrivalCV = 1
	}
	if s.BlockTokens == 0 {
		s.BlockTokens = 64
	}
	g := &generator{s: &s, rng: rand.New(rand.NewPCG(seed, 0x5eed)), seed: seed}
	if s.PrefixShare > 0 {
		g.zipf = rand.NewZipf(g.rng, s.PrefixZipf, 1, uint64(s.PrefixGroups-1))
		g.groups = make([][]uint64, s.PrefixGroups)
		for i := range g.groups {
			g.groups[i] = g.blocks(nil, s.PrefixTokens.sample(g.rng))
		}
	}
	if s.Documents > 0 {
		g.corpus()
	}
	out := make([]Request, 0, s.Requests)
	switch {
	case s.Turns > 0 && s.Branches > 1:
		return g.agents(out), nil
	case s.Turns > 0:
		return g.conversations(out), nil
	}
	var t time.Duration
	for len(out) < s.Requests {
		t += g.gap(t)
		u := g.rng.Float64()
		switch {
		case u < s.SessionShare && len(g.sessions) > 0:
			sess := g.sessions[g.rng.IntN(len(g.sessions))]
			req := g.followUp(t, sess)
			g.extend(sess, &req)
			out = append(out, req)
		case u < s.SessionShare+s.FanoutShare:
			var at time.Duration
			out, at = g.fanout(out, t)
			// Skip the arrival gaps of the children so that Rate stays the
			// mean request rate.
			for k := 1; k < s.FanoutSize; k++ {
				t += g.gap(t)
			}
			t = max(t, at)
		default:
			req := g.fresh(t, g.head(), g.drawAdapter())
			if s.SessionShare > 0 {
				g.remember(&req)
			}
			out = append(out, req)
		}
	}
	return out, nil
}

// fanout appends an agent burst arriving from t: up to FanoutSize requests
// a few milliseconds apart sharing a new parent prefix. It returns when the
// next child would have arrived.
func (g *generator) fanout(out []Request, t time.Duration) ([]Request, time.Duration) {
	parent := g.blocks(nil, g.s.PrefixTokens.sample(g.rng))
	adapter := g.drawAdapter()
	at := t
	for k := 0; k < g.s.FanoutSize && len(out) < g.s.Requests; k++ {
		out = append(out, g.fresh(at, parent, adapter))
		at += time.Duration(1+g.rng.IntN(5)) * time.Millisecond
	}
	return out, at
}

// conversations generates the requests of paced conversations (Synthetic.Turns):
// fresh arrivals at Rate/Turns, each starting a conversation unless it is an
// agent burst, and every next turn after its reply and a pause.
func (g *generator) conversations(out []Request) []Request {
	s := g.s
	more := 1 - 1/s.Turns // the probability of a further turn
	mean := s.Turns / s.Rate
	var next turnQueue
	t := g.gapAt(0, mean)
	for len(out) < s.Requests {
		if len(next) > 0 && next[0].ready <= t {
			sess := heap.Pop(&next).(*session)
			req := g.followUp(sess.ready, sess)
			g.reply(&req)
			g.pace(sess, &req)
			out = append(out, req)
			if g.rng.Float64() < more {
				heap.Push(&next, sess)
			}
			continue
		}
		if g.rng.Float64() < s.FanoutShare {
			out, _ = g.fanout(out, t)
		} else {
			req := g.fresh(t, g.head(), g.drawAdapter())
			g.reply(&req)
			g.nextSess++
			sess := &session{key: fmt.Sprintf("s%d", g.nextSess), route: req.Route, adapter: req.Adapter}
			req.Session = sess.key
			g.pace(sess, &req)
			out = append(out, req)
			if g.rng.Float64() < more {
				heap.Push(&next, sess)
			}
		}
		t += g.gapAt(t, mean)
	}
	// Agent bursts run a few milliseconds past the next arrivals.
	slices.SortStableFunc(out, func(a, b Request) int { return cmp.Compare(a.Arrival, b.Arrival) })
	return out
}

// reply sets req.Reply: new blocks continuing the prompt's full blocks over
// its partial tail and its output, full blocks only.
func (g *generator) reply(req *Request) {
	bt := g.s.BlockTokens
	full := min(req.PromptTokens/bt, len(req.Prefix))
	total := req.PromptTokens + req.OutputTokens
	if total/bt <= full {
		return
	}
	h := g.blocks(req.Prefix[:full], total-full*bt)
	req.Reply = h[full : total/bt : total/bt]
}

// replyTokenTime is how long a reply takes to stream per output token, as
// paced conversations assume.
const replyTokenTime = 40 * time.Millisecond

// pace records req, with its Reply, as the history of sess and schedules
// the next turn after the reply and a pause.
func (g *generator) pace(sess *session, req *Request) {
	full := min(req.PromptTokens/g.s.BlockTokens, len(req.Prefix))
	sess.prompt = req.PromptTokens + req.OutputTokens
	sess.hashes = append(req.Prefix[:full:full], req.Reply...)
	sess.ready = req.Arrival + time.Duration(req.OutputTokens)*replyTokenTime
	if g.s.ThinkTime > 0 {
		sess.ready += time.Duration(g.rng.ExpFloat64() * float64(g.s.ThinkTime))
	}
}

// turnQueue orders paced conversations by the arrival of their next turn.
type turnQueue []*session

func (q turnQueue) Len() int           { return len(q) }
func (q turnQueue) Less(i, j int) bool { return q[i].ready < q[j].ready }
func (q turnQueue) Swap(i, j int)      { q[i], q[j] = q[j], q[i] }
func (q *turnQueue) Push(x any)        { *q = append(*q, x.(*session)) }
func (q *turnQueue) Pop() any {
	old := *q
	x := old[len(old)-1]
	old[len(old)-1] = nil
	*q = old[:len(old)-1]
	return x
}

type generator struct {
	s        *Synthetic
	rng      *rand.Rand
	seed     uint64
	adapters *rand.Zipf // with Synthetic.Adapters, lazily
	zipf     *rand.Zipf
	groups   [][]uint64
	docs     [][]uint64 // with Synthetic.Documents: each document's block ids
	docZipf  *rand.Zipf
	picked   []int // scratch: the documents drawn for one prompt
	sessions []*session
	nextSess int
	nextID   uint64
}

// gap draws the inter-arrival time after an arrival at t: exponential for
// CV 1, else Gamma with shape 1/CV^2.
func (g *generator) gap(t time.Duration) time.Duration { return g.gapAt(t, 1/g.s.Rate) }

// gapAt draws an inter-arrival time of mean seconds at a steady rate, as
// gap does, after an arrival at t: shorter or longer by the load cycle's
// factor there.
func (g *generator) gapAt(t time.Duration, mean float64) time.Duration {
	if c := g.s.Cycle; c.Period > 0 || c.Every > 0 {
		mean /= c.factor(t)
	}
	return g.gapOf(mean)
}

// gapOf draws an inter-arrival time of mean seconds, as gap does.
func (g *generator) gapOf(mean float64) time.Duration {
	var x float64
	if g.s.ArrivalCV == 1 {
		x = g.rng.ExpFloat64() * mean
	} else {
		k := 1 / (g.s.ArrivalCV * g.s.ArrivalCV)
		x = gammaSample(g.rng, k) * mean / k
	}
	return time.Duration(x * float64(time.Second))
}

// gammaSample draws from Gamma(k, 1) (Marsaglia and Tsang).
func gammaSample(r *rand.Rand, k float64) float64 {
	if k < 1 {
		return gammaSample(r, k+1) * math.Pow(r.Float64(), 1/k)
	}
	d := k - 1.0/3
	c := 1 / math.Sqrt(9*d)
	for {
		x := r.NormFloat64()
		v := 1 + c*x
		if v <= 0 {
			continue
		}
		v = v * v * v
		u := r.Float64()
		if u < 1-0.0331*x*x*x*x || math.Log(u) < 0.5*x*x+d*(1-v+math.Log(v)) {
			return d * v
		}
	}
}

// blocks extends the chain head with fresh unique blocks covering tokens
// tokens (the last block possibly partial).
func (g *generator) blocks(head []uint64, tokens int) []uint64 {
	bt := g.s.BlockTokens
	n := (tokens + bt - 1) / bt
	out := make([]uint64, len(head), len(head)+n)
	copy(out, head)
	prev := uint64(0)
	if len(head) > 0 {
		prev = head[len(head)-1]
	}
	for i := 0; i < n; i++ {
		g.nextID++
		prev = ChainHash(prev, g.nextID)
		out = append(out, prev)
	}
	return out
}

// fresh builds a request made of head (full blocks) and a new message,
// served with adapter.
func (g *generator) fresh(t time.Duration, head []uint64, adapter string) Request {
	head = salted(head, adapter)
	msg := g.s.Prompt.sample(g.rng)
	prompt := len(head)*g.s.BlockTokens + msg
	route := g.drawRoute()
	return Request{
		Arrival:      t,
		PromptTokens: min(prompt, MaxPromptTokens),
		OutputTokens: g.output(route),
		BlockTokens:  g.s.BlockTokens,
		Prefix:       g.blocks(head, msg),
		Route:        route,
		Adapter:      adapter,
	}
}

// remember starts a session with req as its first turn, replacing the
// oldest remembered session when Sessions are kept.
func (g *generator) remember(req *Request) {
	g.nextSess++
	sess := &session{key: fmt.Sprintf("s%d", g.nextSess)}
	req.Session = sess.key
	sess.route, sess.adapter = req.Route, req.Adapter
	g.extend(sess, req)
	if len(g.sessions) < g.s.Sessions {
		g.sessions = append(g.sessions, sess)
	} else {
		g.sessions[g.nextSess%g.s.Sessions] = sess
	}
}

// extend records req's prompt and reply as the session's history: its full
// prompt blocks stay, and the partial tail plus the reply become new blocks.
func (g *generator) extend(sess *session, req *Request) {
	bt := g.s.BlockTokens
	full := min(req.PromptTokens/bt, len(req.Prefix))
	sess.prompt = req.PromptTokens + req.OutputTokens
	h := g.blocks(req.Prefix[:full], sess.prompt-full*bt)
	sess.hashes = h[:sess.prompt/bt] // only full blocks are a reusable head
}

// followUp builds the next turn of sess arriving at t; the caller records
// it as the session's history. A session whose history outgrew the prompt
// cap starts over.
func (g *generator) followUp(t time.Duration, sess *session) Request {
	msg := g.s.Prompt.sample(g.rng) / 4
	msg = max(msg, 1)
	head, base := sess.hashes, sess.prompt
	if base+msg > g.historyCap() {
		head, base = nil, 0
	}
	req := Request{
		Arrival:      t,
		PromptTokens: base + msg,
		OutputTokens: g.output(sess.route),
		BlockTokens:  g.s.BlockTokens,
		Prefix:       g.blocks(head, base-len(head)*g.s.BlockTokens+msg),
		Session:      sess.key,
		Route:        sess.route,
		Adapter:      sess.adapter,
	}
	return req
}
