package sim

import (
	"cmp"
	"container/heap"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"time"
)

// LoadCycle varies a workload's arrival rate over time: a daily cycle
// compressed into the run, and bursts on top of it. The rate at time t is
// the workload's Rate times the cycle's factor at t over the factor's mean,
// so that Rate stays the long-run mean. Its zero value keeps the rate steady.
type LoadCycle struct {
	// Period is the length of one cycle; 0 means no cycle. The rate starts
	// at its trough, Rate × (1 − Depth), peaks at Rate × (1 + Depth) half a
	// period in, and falls back, as a cosine.
	Period time.Duration
	// Depth, in [0, 1), is how far the cycle swings the rate.
	Depth float64
	// Every, if positive, starts a burst every Every, from Every on: for
	// Length (at most Every), the rate is multiplied by Factor (at least 1).
	Every, Length time.Duration
	Factor        float64
}

// factor returns the rate's multiplier at t.
func (c LoadCycle) factor(t time.Duration) float64 {
	m := 1.0
	if c.Period > 0 {
		m -= c.Depth * math.Cos(2*math.Pi*float64(t)/float64(c.Period))
	}
	mean := 1.0
	if c.Every > 0 {
		if t >= c.Every && t%c.Every < c.Length {
			m *= c.Factor
		}
		mean += (c.Factor - 1) * float64(c.Length) / float64(c.Every)
	}
	return m / mean
}

func (c LoadCycle) validate() error {
	bad := func(what string) error {
		return fmt.Errorf("%w: load cycle %+v: %s", ErrInvalidWorkload, c, what)
	}
	switch {
	case c.Period < 0:
		return bad("negative period")
	case !(c.Depth >= 0 && c.Depth < 1):
		return bad("depth must be in [0, 1)")
	case c.Every < 0:
		return bad("negative burst interval")
	case c.Every > 0 && (c.Length <= 0 || c.Length > c.Every):
		return bad("burst length must be positive and at most the interval")
	case c.Every > 0 && (!(c.Factor >= 1) || math.IsInf(c.Factor, 0) || c.Factor > 1e3):
		return bad("burst factor must be in [1, 1000]")
	}
	return nil
}

// validateFamilies checks the fields of agents, retrieval and load cycles.
func (s *Synthetic) validateFamilies() error {
	switch {
	case s.Branches < 0 || s.Branches > 1<<10:
		return fmt.Errorf("%w: %d branches, want 0 to 1024", ErrInvalidWorkload, s.Branches)
	case s.Branches > 1 && s.Turns == 0:
		return fmt.Errorf("%w: branches are the steps of paced conversations; set Turns", ErrInvalidWorkload)
	case s.Branches > 1 && s.FanoutShare > 0:
		return fmt.Errorf("%w: an agent workload's steps fan out already; set Branches or FanoutShare", ErrInvalidWorkload)
	case s.Documents < 0 || s.Documents > 1<<20:
		return fmt.Errorf("%w: %d documents, want 0 to 2^20", ErrInvalidWorkload, s.Documents)
	case s.Documents > 0 && (!(s.DocumentZipf > 1) || math.IsInf(s.DocumentZipf, 0)):
		return fmt.Errorf("%w: document zipf %v, want finite and > 1", ErrInvalidWorkload, s.DocumentZipf)
	case s.Documents > 0 && (s.Retrieved < 1 || 2*s.Retrieved > s.Documents):
		return fmt.Errorf("%w: %d documents retrieved of %d, want 1 to half of them", ErrInvalidWorkload, s.Retrieved, s.Documents)
	}
	if s.Documents > 0 {
		if err := s.DocumentTokens.validate("document", MaxPromptTokens/max(s.Retrieved, 1)); err != nil {
			return err
		}
	}
	return s.Cycle.validate()
}

// historyCap is the longest prompt a conversation's next turn may have
// before the conversation drops its history.
func (g *generator) historyCap() int {
	c := g.s.Prompt.Max + g.s.PrefixTokens.Max
	if g.s.Documents > 0 {
		c += g.s.Retrieved * g.s.DocumentTokens.Max
	}
	return min(c, MaxPromptTokens)
}

// head draws the shared head of a fresh request: one of the shared
// prefixes with probability PrefixShare, then, with Documents, the
// retrieved documents.
func (g *generator) head() []uint64 {
	var head []uint64
	if g.s.PrefixShare > 0 && g.rng.Float64() < g.s.PrefixShare {
		head = g.groups[g.zipf.Uint64()]
	}
	if g.s.Documents > 0 {
		head = g.retrieve(head)
	}
	return head
}

// corpus draws the documents' lengths and block ids.
func (g *generator) corpus() {
	s := g.s
	g.docZipf = rand.NewZipf(g.rng, s.DocumentZipf, 1, uint64(s.Documents-1))
	g.docs = make([][]uint64, s.Documents)
	for i := range g.docs {
		n := (s.DocumentTokens.sample(g.rng) + s.BlockTokens - 1) / s.BlockTokens
		ids := make([]uint64, n)
		for k := range ids {
			g.nextID++
			ids[k] = g.nextID
		}
		g.docs[i] = ids
	}
}

// retrieve extends head with Retrieved distinct documents in the order
// drawn; a document drawn twice is drawn again.
func (g *generator) retrieve(head []uint64) []uint64 {
	g.picked = g.picked[:0]
	n := len(head)
	for len(g.picked) < g.s.Retrieved {
		d := int(g.docZipf.Uint64())
		if slices.Contains(g.picked, d) {
			continue
		}
		g.picked = append(g.picked, d)
		n += len(g.docs[d])
	}
	out := make([]uint64, len(head), n)
	copy(out, head)
	prev := uint64(0)
	if len(head) > 0 {
		prev = head[len(head)-1]
	}
	for _, d := range g.picked {
		for _, id := range g.docs[d] {
			prev = ChainHash(prev, id)
			out = append(out, prev)
		}
	}
	return out
}

// agents generates the requests of agent workloads (Synthetic.Branches):
// fresh agents at Rate/(Turns × Branches), each a task that fans out into
// branches at every step, the next step after the longest reply and a
// pause.
func (g *generator) agents(out []Request) []Request {
	s := g.s
	more := 1 - 1/s.Turns // the probability of a further step
	mean := s.Turns * float64(s.Branches) / s.Rate
	var next turnQueue
	t := g.gapAt(0, mean)
	for len(out) < s.Requests {
		if len(next) > 0 && next[0].ready <= t {
			sess := heap.Pop(&next).(*session)
			out = g.step(out, sess.ready, sess)
			if g.rng.Float64() < more {
				heap.Push(&next, sess)
			}
			continue
		}
		g.nextSess++
		sess := &session{key: fmt.Sprintf("a%d", g.nextSess), route: g.drawRoute(), adapter: g.drawAdapter()}
		head := salted(g.head(), sess.adapter)
		sess.prompt = len(head)*s.BlockTokens + s.Prompt.sample(g.rng)
		sess.hashes = g.blocks(head, sess.prompt-len(head)*s.BlockTokens)[:sess.prompt/s.BlockTokens]
		out = g.step(out, t, sess)
		if g.rng.Float64() < more {
			heap.Push(&next, sess)
		}
		t += g.gapAt(t, mean)
	}
	// A step's branches run a few milliseconds past the next arrivals.
	slices.SortStableFunc(out, func(a, b Request) int { return cmp.Compare(a.Arrival, b.Arrival) })
	return out
}

// step appends one step of the agent sess from t: Branches requests that
// share its history, and records their merged replies as its next
// history.
func (g *generator) step(out []Request, t time.Duration, sess *session) []Request {
	s := g.s
	bt := s.BlockTokens
	if sess.prompt+max(s.Prompt.Max/4, 1) > g.historyCap() {
		sess.hashes, sess.prompt = nil, 0 // the agent starts over
	}
	at, longest, merged := t, 0, 0
	for k := 0; k < s.Branches && len(out) < s.Requests; k++ {
		msg := max(s.Prompt.sample(g.rng)/4, 1)
		req := Request{
			Arrival:      at,
			PromptTokens: sess.prompt + msg,
			OutputTokens: g.output(sess.route),
			BlockTokens:  bt,
			Prefix:       g.blocks(sess.hashes, sess.prompt-len(sess.hashes)*bt+msg),
			Session:      sess.key,
			Route:        sess.route,
			Adapter:      sess.adapter,
		}
		out = append(out, req)
		longest, merged = max(longest, req.OutputTokens), merged+req.OutputTokens
		at += time.Duration(1+g.rng.IntN(5)) * time.Millisecond
	}
	prompt := sess.prompt + merged
	h := g.blocks(sess.hashes, prompt-len(sess.hashes)*bt)
	sess.prompt, sess.hashes = prompt, h[:prompt/bt]
	sess.ready = t + time.Duration(longest)*replyTokenTime
	if s.ThinkTime > 0 {
		sess.ready += time.Duration(g.rng.ExpFloat64() * float64(s.ThinkTime))
	}
	return out
}

// Rates of the out-of-sample workload families, in requests per second for
// 8 replicas.
const (
	// AgenticRate is the arrival rate of the agentic scenario, branches
	// included.
	AgenticRate = 48.0
	// RAGRate is the arrival rate of the rag scenario.
	RAGRate = 20.0
	// DiurnalRate is the mean arrival rate of the diurnal scenario.
	DiurnalRate = DefaultRate
)

// AgenticSynthetic returns the workload of the agentic scenario: n
// requests at rate, from agents ([Synthetic].Branches) whose task (median
// 4000 tokens, 20% after one of 32 shared system prompts) fans out into 8
// parallel branches at every step, 4 steps on average, each next step one
// second on average after the longest branch's reply and carrying every
// branch's reply; outputs as the default workload's.
func AgenticSynthetic(n int, rate float64) Synthetic {
	w := DefaultSynthetic(n, rate)
	w.Prompt = LogNormal{Median: 4000, Sigma: 0.8, Min: 256, Max: 32768}
	w.FanoutShare = 0
	w.Turns, w.Branches, w.ThinkTime = 4, 8, time.Second
	return w
}

// RAGSynthetic returns the workload of the rag scenario: n requests at
// rate, each a question (median 200 tokens) after one of 4 shared system
// prompts and 4 documents retrieved from a corpus of 512 (Zipf 1.2, median
// 2000 tokens each, so prompts of about 10k tokens), in conversations of 2
// turns on average, the next 10 s on average after the reply.
func RAGSynthetic(n int, rate float64) Synthetic {
	w := DefaultSynthetic(n, rate)
	w.Prompt = LogNormal{Median: 200, Sigma: 0.8, Min: 16, Max: 4096}
	w.PrefixShare, w.PrefixGroups = 1, 4
	w.FanoutShare = 0
	w.Documents, w.DocumentZipf, w.Retrieved = 512, 1.2, 4
	w.DocumentTokens = LogNormal{Median: 2000, Sigma: 0.5, Min: 256, Max: 8192}
	w.Turns, w.ThinkTime = 2, 10*time.Second
	return w
}

// DiurnalSynthetic returns the workload of the diurnal scenario: the
// default workload at a mean rate of rate, swinging by ±50% over a cycle of
// 240 s (about the run's span) and doubling for 4 s every 40 s.
func DiurnalSynthetic(n int, rate float64) Synthetic {
	w := DefaultSynthetic(n, rate)
	w.Cycle = LoadCycle{Period: 240 * time.Second, Depth: 0.5, Every: 40 * time.Second, Length: 4 * time.Second, Factor: 2}
	return w
}

// familyScenarios returns the out-of-sample workload families: agentic,
// rag and diurnal, each on the default scenario's cluster.
func familyScenarios() []Scenario {
	cluster := Config{Replicas: 8, Routers: 1, Scrape: time.Second, Engine: Engine{KVBlocks: DefaultScenarioKVBlocks}}
	return []Scenario{
		{
			Name:     "agentic",
			Doc:      "default's cluster; agents whose every step fans out into 8 parallel branches of one long context",
			Config:   cluster,
			Workload: AgenticSynthetic(DefaultRequests, AgenticRate),
			Policies: DefaultPolicies(),
		},
		{
			Name:     "rag",
			Doc:      "default's cluster; questions over 4 of 512 shared documents retrieved per prompt, about 10k tokens",
			Config:   cluster,
			Workload: RAGSynthetic(DefaultRequests, RAGRate),
			Policies: DefaultPolicies(),
		},
		{
			Name:     "diurnal",
			Doc:      "default, its rate swinging ±50% over 240 s and doubling for 4 s every 40 s",
			Config:   cluster,
			Workload: DiurnalSynthetic(DefaultRequests, DiurnalRate),
			Policies: DefaultPolicies(),
		},
	}
}
