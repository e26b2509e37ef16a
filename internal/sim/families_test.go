package sim

import (
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// commonHead returns the number of leading hashes a and b share.
func commonHead(a, b []uint64) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}

func TestAgenticWorkload(t *testing.T) {
	w := AgenticSynthetic(4000, AgenticRate)
	reqs, err := w.Generate(9)
	if err != nil {
		t.Fatal(err)
	}
	if len(reqs) != w.Requests {
		t.Fatalf("%d requests, want %d", len(reqs), w.Requests)
	}
	if err := validateRequests(reqs, DefaultBlockSize); err != nil {
		t.Fatal(err)
	}
	again, _ := w.Generate(9)
	if !slices.EqualFunc(reqs, again, func(a, b Request) bool {
		return a.Arrival == b.Arrival && a.PromptTokens == b.PromptTokens && slices.Equal(a.Prefix, b.Prefix)
	}) {
		t.Fatal("not deterministic for a seed")
	}
	bySess := map[string][]Request{}
	for _, r := range reqs {
		if r.Session == "" {
			t.Fatal("an agent's request without its session")
		}
		if len(r.Prefix) != (r.PromptTokens+w.BlockTokens-1)/w.BlockTokens {
			t.Fatalf("request with %d tokens has %d hashes", r.PromptTokens, len(r.Prefix))
		}
		bySess[r.Session] = append(bySess[r.Session], r)
	}
	steps, later := 0, 0
	for key, rs := range bySess {
		// The branches of a step arrive together and share the history up
		// to their own messages; the next step starts with that history
		// and comes after the longest reply.
		for i := 0; i < len(rs); {
			j := i + 1
			for j < len(rs) && rs[j].Arrival-rs[i].Arrival < time.Second {
				j++
			}
			if j-i > w.Branches {
				t.Fatalf("%s: a step of %d branches, want at most %d", key, j-i, w.Branches)
			}
			if j-i == w.Branches {
				steps++
			}
			history := (rs[i].PromptTokens - rs[i].PromptTokens%w.BlockTokens) / w.BlockTokens
			history = min(history, len(rs[i].Prefix))
			longest := 0
			for k := i; k < j; k++ {
				longest = max(longest, rs[k].OutputTokens)
				if k > i && commonHead(rs[i].Prefix, rs[k].Prefix) < history-w.Prompt.Max/4/w.BlockTokens-1 {
					t.Fatalf("%s: branches of one step share %d of %d blocks", key, commonHead(rs[i].Prefix, rs[k].Prefix), history)
				}
			}
			if j < len(rs) {
				next := rs[j]
				if next.Arrival < rs[i].Arrival+time.Duration(longest)*replyTokenTime {
					t.Fatalf("%s: next step at %v, before the longest reply ends", key, next.Arrival)
				}
				if shared := commonHead(rs[i].Prefix, next.Prefix); next.PromptTokens > rs[i].PromptTokens && shared*w.BlockTokens < rs[i].PromptTokens-w.Prompt.Max/4-w.BlockTokens {
					t.Fatalf("%s: next step shares %d blocks of a %d-token history", key, shared, rs[i].PromptTokens)
				}
				later++
			}
			i = j
		}
	}
	if steps < 100 || later < 100 {
		t.Fatalf("%d whole steps and %d later steps, want agents of several steps", steps, later)
	}
	if b := InfiniteCacheHitRate(reqs); b < 0.6 {
		t.Errorf("infinite-cache hit rate %.2f, want branches and steps to share their history", b)
	}
}

func TestRAGWorkload(t *testing.T) {
	w := RAGSynthetic(3000, RAGRate)
	w.Turns = 1       // fresh prompts only
	w.PrefixShare = 0 // so that a shared head is a shared document
	reqs, err := w.Generate(9)
	if err != nil {
		t.Fatal(err)
	}
	if err := validateRequests(reqs, DefaultBlockSize); err != nil {
		t.Fatal(err)
	}
	// Every prompt is Retrieved documents and a question; the corpus's
	// most popular documents open many prompts, so many prompts share a
	// head, and none shares the whole prompt.
	var tokens float64
	longShared := 0
	for i, r := range reqs {
		tokens += float64(r.PromptTokens)
		if i > 0 {
			if n := commonHead(reqs[i-1].Prefix, r.Prefix); n > 0 {
				longShared++
			}
			if slices.Equal(reqs[i-1].Prefix, r.Prefix) {
				t.Fatal("two prompts are identical")
			}
		}
	}
	mean := tokens / float64(len(reqs))
	if mean < 6000 || mean > 16000 {
		t.Errorf("mean prompt %.0f tokens, want about 10k (4 documents of about 2000)", mean)
	}
	if longShared < len(reqs)/50 {
		t.Errorf("%d consecutive prompts share a head, want popular documents to repeat", longShared)
	}
	if b := InfiniteCacheHitRate(reqs); b < 0.3 || b > 0.95 {
		t.Errorf("infinite-cache hit rate %.2f, want shared documents and unique questions", b)
	}

	// retrieve draws distinct documents.
	g := &generator{s: &w}
	g.rng = rand.New(rand.NewPCG(3, 0))
	w.BlockTokens = 64
	g.corpus()
	for range 200 {
		g.retrieve(nil)
		seen := map[int]bool{}
		for _, d := range g.picked {
			if seen[d] {
				t.Fatalf("document %d retrieved twice: %v", d, g.picked)
			}
			seen[d] = true
		}
	}
}

func TestLoadCycle(t *testing.T) {
	c := LoadCycle{Period: 200 * time.Second, Depth: 0.5, Every: 40 * time.Second, Length: 4 * time.Second, Factor: 2}
	// The factor's time average is 1, so Rate is the mean.
	var sum float64
	const n = 400000
	for i := range n {
		sum += c.factor(time.Duration(i) * c.Period / n)
	}
	if avg := sum / n; math.Abs(avg-1) > 0.01 {
		t.Errorf("mean factor %.3f, want 1", avg)
	}
	lo, hi := c.factor(0), c.factor(c.Period/2-time.Second)
	if math.Abs(hi/lo-3) > 0.01 {
		t.Errorf("peak over trough %.2f, want (1+0.5)/(1-0.5) = 3", hi/lo)
	}
	if r := c.factor(c.Every+time.Second) / c.factor(c.Every-time.Millisecond); math.Abs(r-2) > 0.05 {
		t.Errorf("burst raises the rate %.2fx, want 2x", r)
	}

	w := PrefixSynthetic(20000, 50)
	w.SessionShare, w.FanoutShare = 0, 0
	w.Cycle = LoadCycle{Period: 400 * time.Second, Depth: 0.6}
	reqs, err := w.Generate(9)
	if err != nil {
		t.Fatal(err)
	}
	count := func(from, to time.Duration) int {
		n := 0
		for _, r := range reqs {
			if r.Arrival >= from && r.Arrival < to {
				n++
			}
		}
		return n
	}
	trough, peak := count(0, 20*time.Second), count(190*time.Second, 210*time.Second)
	if r := float64(peak) / float64(trough); r < 3 || r > 5 {
		t.Errorf("%d arrivals around the peak, %d around the trough: ratio %.1f, want about 4", peak, trough, r)
	}
	span := reqs[len(reqs)-1].Arrival.Seconds()
	if rate := float64(len(reqs)) / span; rate < 45 || rate > 55 {
		t.Errorf("mean rate %.1f/s, want about 50", rate)
	}
}

func TestFamiliesUnchangedWhenOff(t *testing.T) {
	// The fields of the families draw no random number when unset, so
	// the other workloads are as they were: this pins a hash of the
	// default workload's first requests.
	reqs, err := DefaultSynthetic(200, DefaultRate).Generate(1)
	if err != nil {
		t.Fatal(err)
	}
	h := uint64(0)
	for _, r := range reqs {
		h = ChainHash(h, uint64(r.Arrival))
		h = ChainHash(h, uint64(r.PromptTokens))
		for _, p := range r.Prefix {
			h = ChainHash(h, p)
		}
	}
	if h != defaultWorkloadHash {
		t.Errorf("default workload hash %#x, want %#x", h, uint64(defaultWorkloadHash))
	}
}

// defaultWorkloadHash is the hash TestFamiliesUnchangedWhenOff computes
// over DefaultSynthetic(200, DefaultRate) for seed 1.
const defaultWorkloadHash = 0xdb5a93788676d33a

func TestInvalidFamilies(t *testing.T) {
	for name, f := range map[string]func(*Synthetic){
		"negative branches":        func(s *Synthetic) { s.Branches = -1 },
		"branches without turns":   func(s *Synthetic) { s.Turns, s.Branches = 0, 4 },
		"branches and fanout":      func(s *Synthetic) { s.Branches = 4 },
		"negative documents":       func(s *Synthetic) { s.Documents = -1 },
		"document zipf 1":          func(s *Synthetic) { s.Documents, s.DocumentZipf, s.Retrieved = 16, 1, 2 },
		"retrieve too many":        func(s *Synthetic) { s.Documents, s.DocumentZipf, s.Retrieved = 16, 1.2, 9 },
		"retrieve none":            func(s *Synthetic) { s.Documents, s.DocumentZipf, s.Retrieved = 16, 1.2, 0 },
		"bad document length":      func(s *Synthetic) { s.Documents, s.DocumentZipf, s.Retrieved = 16, 1.2, 2 },
		"negative period":          func(s *Synthetic) { s.Cycle.Period = -time.Second },
		"depth 1":                  func(s *Synthetic) { s.Cycle = LoadCycle{Period: time.Minute, Depth: 1} },
		"depth NaN":                func(s *Synthetic) { s.Cycle = LoadCycle{Period: time.Minute, Depth: math.NaN()} },
		"burst longer than period": func(s *Synthetic) { s.Cycle = LoadCycle{Every: time.Second, Length: 2 * time.Second, Factor: 2} },
		"burst factor below 1":     func(s *Synthetic) { s.Cycle = LoadCycle{Every: time.Second, Length: time.Second / 2, Factor: 0.5} },
		"burst factor infinite": func(s *Synthetic) {
			s.Cycle = LoadCycle{Every: time.Second, Length: time.Second / 2, Factor: math.Inf(1)}
		},
	} {
		w := DefaultSynthetic(10, 1)
		f(&w)
		if _, err := w.Generate(1); !errors.Is(err, ErrInvalidWorkload) {
			t.Errorf("%s: %v", name, err)
		}
	}
}
