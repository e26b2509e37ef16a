package gateway

import (
	"encoding/json"
	"math"
	"net/http"
	"slices"
	"time"

	"github.com/llmlb/llmlb/signals"
)

// DebugState is the JSON document [Gateway.Debug] serves.
type DebugState struct {
	// Time is when the state was read.
	Time time.Time `json:"time"`
	// Endpoints are the replicas, in the order given to New or Update.
	Endpoints []DebugEndpoint `json:"endpoints"`
	// Ejected lists the endpoints ejected as outliers; Cooling those out
	// for the wait their overload answers asked.
	Ejected []string `json:"ejected"`
	Cooling []string `json:"cooling,omitempty"`
	// InFlight and Sessions are the admission controller's requests in
	// flight and sessions tracked; absent without admission caps.
	InFlight *int `json:"admission_in_flight,omitempty"`
	Sessions *int `json:"admission_sessions,omitempty"`
	// Share is the state of the sharing with the other replicas; absent
	// without [Config].Share.
	Share *DebugShare `json:"share,omitempty"`
	// Queue is the fair queue's state; absent without [Config].Queue.
	Queue *DebugQueue `json:"queue,omitempty"`
}

// DebugQueue is the fair queue's state in a [DebugState] (fair.Stats).
type DebugQueue struct {
	InFlight       int   `json:"in_flight"`
	TokensInFlight int64 `json:"tokens_in_flight"`
	Waiting        int   `json:"waiting"`
	Principals     int   `json:"principals"`
}

// DebugShare is the sharing state in a [DebugState] (share.Stats).
type DebugShare struct {
	ID          string `json:"id"`
	Connected   bool   `json:"connected"`
	Peers       int    `json:"peers"`
	Published   uint64 `json:"published"`
	Unpublished uint64 `json:"unpublished"`
	Received    uint64 `json:"received"`
	Rejected    uint64 `json:"rejected"`
	Dropped     uint64 `json:"dropped"`
}

// DebugEndpoint is one replica in a [DebugState].
type DebugEndpoint struct {
	Key string `json:"key"`
	// Healthy is false while the endpoint is ejected, cooling down, asleep
	// or marked unhealthy.
	Healthy bool `json:"healthy"`
	// Asleep is true while the scrape the balancer trusts says the engine
	// is asleep ([signals.Observation].Asleep, vLLM's
	// vllm:engine_sleep_state): it is not picked while another endpoint is
	// awake.
	Asleep bool `json:"asleep,omitempty"`
	// Outstanding, Queued, PrefillTokens and DecodeTokens are the
	// balancer's own accounting (llmlb.EndpointStats).
	Outstanding   int64 `json:"outstanding"`
	Queued        int64 `json:"queued"`
	PrefillTokens int64 `json:"prefill_tokens"`
	DecodeTokens  int64 `json:"decode_tokens"`
	// Signal is the last engine observation; absent if none.
	Signal *DebugSignal `json:"signal,omitempty"`
	// Scrape is the endpoint's scrape status; absent without scraping.
	Scrape *DebugScrape `json:"scrape,omitempty"`
	// IndexBlocks is the number of prompt blocks the prefix index believes
	// the endpoint caches; absent without a known index.
	IndexBlocks *int `json:"index_blocks,omitempty"`
	// EventBlocks is the number of blocks the engine's KV events report
	// cached; absent without [Config.Events].
	EventBlocks *int `json:"event_blocks,omitempty"`
}

// DebugSignal is an engine observation in a [DebugEndpoint].
type DebugSignal struct {
	AgeSeconds float64  `json:"age_seconds"`
	Running    int      `json:"running"`
	Waiting    int      `json:"waiting"`
	KVUsage    *float64 `json:"kv_usage,omitempty"` // absent when the engine does not report it
	KVBlocks   int      `json:"kv_blocks,omitempty"`
	// Engine is the engine whose metrics were scraped (as
	// [signals.Engine.String] names it), or "orca" when the signal is made
	// of the replica's ORCA load reports alone, with no scrape the balancer
	// still trusts.
	Engine string `json:"engine,omitempty"`
}

// orcaEngine is the [DebugSignal] engine of an observation made of ORCA
// reports alone. The scraper's store holds only scrapes, whose engine is
// the one detected or configured, and the ORCA reports of the proxied
// responses, which carry none ([signals.EngineAuto]): a scrape that the
// reports outlive is dropped with its engine.
const orcaEngine = "orca"

// engineName returns the name [DebugSignal].Engine shows for e.
func engineName(e signals.Engine) string {
	if e == signals.EngineAuto {
		return orcaEngine
	}
	return e.String()
}

// DebugScrape is a scrape status in a [DebugEndpoint].
type DebugScrape struct {
	Scrapes             uint64 `json:"scrapes"`
	Failures            uint64 `json:"failures"`
	ConsecutiveFailures int    `json:"consecutive_failures"`
	LastError           string `json:"last_error,omitempty"`
}

// State returns the gateway's current state, as [Gateway.Debug] serves it.
func (g *Gateway) State() DebugState {
	now := time.Now()
	g.mu.Lock()
	keys := slices.Clone(g.backends)
	g.mu.Unlock()
	stats := g.balancer.Stats()
	byKey := make(map[string]int, len(stats))
	for i, s := range stats {
		byKey[s.Key] = i
	}
	st := DebugState{Time: now, Endpoints: make([]DebugEndpoint, 0, len(keys)), Ejected: g.ejector.Ejected(), Cooling: g.ejector.Cooling()}
	if st.Ejected == nil {
		st.Ejected = []string{}
	}
	for _, k := range keys {
		e := DebugEndpoint{Key: k, Asleep: g.health.isAsleep(k)}
		if i, ok := byKey[k]; ok {
			s := stats[i]
			e.Healthy, e.Outstanding, e.Queued, e.PrefillTokens, e.DecodeTokens = s.Healthy, s.Outstanding, s.Queued, s.PrefillTokens, s.DecodeTokens
		}
		if g.scraper != nil {
			if o, ok := g.scraper.Observation(k); ok && !o.At.IsZero() {
				sig := &DebugSignal{AgeSeconds: now.Sub(o.At).Seconds(), Running: o.Running, Waiting: o.Waiting,
					KVBlocks: o.KVBlocks, Engine: engineName(o.Engine)}
				if !math.IsNaN(o.KVUsage) {
					u := o.KVUsage
					sig.KVUsage = &u
				}
				e.Signal = sig
			}
			if s, ok := g.scraper.Status(k); ok {
				e.Scrape = &DebugScrape{Scrapes: s.Scrapes, Failures: s.Failures, ConsecutiveFailures: s.ConsecutiveFailures}
				if s.LastError != nil {
					e.Scrape.LastError = s.LastError.Error()
				}
			}
		}
		if g.index != nil {
			n := g.index.Len(k)
			e.IndexBlocks = &n
		}
		if g.events != nil {
			n := g.events.Len(k)
			e.EventBlocks = &n
		}
		st.Endpoints = append(st.Endpoints, e)
	}
	if g.group != nil {
		s := g.group.Stats()
		st.Share = &DebugShare{ID: g.group.ID(), Connected: s.Connected, Peers: s.Peers, Published: s.Published,
			Unpublished: s.Unpublished, Received: s.Received, Rejected: s.Rejected, Dropped: s.Dropped}
	}
	if g.queue != nil {
		q := g.queue.Stats()
		st.Queue = &DebugQueue{InFlight: q.InFlight, TokensInFlight: q.TokensInFlight, Waiting: q.Waiting, Principals: q.Principals}
	}
	if g.admission != nil {
		in, ss := g.admission.InFlight(), g.admission.Sessions()
		st.InFlight, st.Sessions = &in, &ss
	}
	return st
}

// Debug returns a handler that serves [Gateway.State] as indented JSON. It
// shows replica addresses and errors: serve it to operators only, never on
// the client-facing listener.
func (g *Gateway) Debug() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(g.State())
	})
}
