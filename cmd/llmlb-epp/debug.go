package main

import (
	"encoding/json"
	"math"
	"net/http"
	"time"

	"github.com/llmlb/llmlb/extproc"
)

// debugState is the JSON document /debug/llmlb serves.
type debugState struct {
	Time     time.Time       `json:"time"`
	Protocol string          `json:"protocol"`
	Policy   string          `json:"policy"`
	Source   debugSource     `json:"source"`
	Ready    bool            `json:"ready"`
	InFlight *int            `json:"admission_in_flight,omitempty"`
	Sessions *int            `json:"admission_sessions,omitempty"`
	Share    *debugShare     `json:"share,omitempty"` // absent without -nats
	Replicas []debugEndpoint `json:"endpoints"`
}

// debugShare is the state of the sharing with the other replicas
// (share.Stats).
type debugShare struct {
	ID          string `json:"id"`
	Connected   bool   `json:"connected"`
	Peers       int    `json:"peers"`
	Published   uint64 `json:"published"`
	Unpublished uint64 `json:"unpublished"`
	Received    uint64 `json:"received"`
	Rejected    uint64 `json:"rejected"`
	Dropped     uint64 `json:"dropped"`
}

type debugSource struct {
	Kind      string    `json:"kind"` // endpoints, file or dns
	Loaded    time.Time `json:"loaded,omitzero"`
	LastError string    `json:"last_error,omitempty"`
}

type debugEndpoint struct {
	Key           string       `json:"key"`
	Healthy       bool         `json:"healthy"`
	Outstanding   int64        `json:"outstanding"`
	Queued        int64        `json:"queued"`
	PrefillTokens int64        `json:"prefill_tokens"`
	DecodeTokens  int64        `json:"decode_tokens"`
	Signal        *debugSignal `json:"signal,omitempty"`
	Scrape        *debugScrape `json:"scrape,omitempty"`
	IndexBlocks   int          `json:"index_blocks"`
	EventBlocks   *int         `json:"event_blocks,omitempty"`
}

type debugSignal struct {
	AgeSeconds float64  `json:"age_seconds"`
	Running    int      `json:"running"`
	Waiting    int      `json:"waiting"`
	KVUsage    *float64 `json:"kv_usage,omitempty"`
	Engine     string   `json:"engine,omitempty"`
}

type debugScrape struct {
	Scrapes             uint64 `json:"scrapes"`
	Failures            uint64 `json:"failures"`
	ConsecutiveFailures int    `json:"consecutive_failures"`
	LastError           string `json:"last_error,omitempty"`
}

// state returns the picker's state for the debug view.
func (s *server) state() debugState {
	now := time.Now()
	st := s.members.status()
	d := debugState{Time: now, Protocol: extproc.ProtocolVersion, Policy: s.o.policy, Ready: st.synced, Replicas: []debugEndpoint{}}
	switch {
	case s.o.endpointsFile != "":
		d.Source.Kind = "file"
	case s.o.dns != "":
		d.Source.Kind = "dns"
	default:
		d.Source.Kind = "endpoints"
	}
	if s.group != nil {
		gs := s.group.Stats()
		d.Share = &debugShare{ID: s.group.ID(), Connected: gs.Connected, Peers: gs.Peers, Published: gs.Published,
			Unpublished: gs.Unpublished, Received: gs.Received, Rejected: gs.Rejected, Dropped: gs.Dropped}
	}
	d.Source.Loaded = st.loaded
	if st.err != nil {
		d.Source.LastError = st.err.Error()
	}
	for _, e := range s.b.Stats() {
		de := debugEndpoint{Key: e.Key, Healthy: e.Healthy, Outstanding: e.Outstanding, Queued: e.Queued,
			PrefillTokens: e.PrefillTokens, DecodeTokens: e.DecodeTokens, IndexBlocks: s.ix.Len(e.Key)}
		if s.scraper != nil {
			if o, ok := s.scraper.Observation(e.Key); ok && !o.At.IsZero() {
				sig := &debugSignal{AgeSeconds: now.Sub(o.At).Seconds(), Running: o.Running, Waiting: o.Waiting, Engine: o.Engine.String()}
				if !math.IsNaN(o.KVUsage) {
					u := o.KVUsage
					sig.KVUsage = &u
				}
				de.Signal = sig
			}
			if ss, ok := s.scraper.Status(e.Key); ok {
				de.Scrape = &debugScrape{Scrapes: ss.Scrapes, Failures: ss.Failures, ConsecutiveFailures: ss.ConsecutiveFailures}
				if ss.LastError != nil {
					de.Scrape.LastError = ss.LastError.Error()
				}
			}
		}
		if s.events != nil {
			n := s.events.Len(e.Key)
			de.EventBlocks = &n
		}
		d.Replicas = append(d.Replicas, de)
	}
	if s.admission != nil {
		in, ss := s.admission.InFlight(), s.admission.Sessions()
		d.InFlight, d.Sessions = &in, &ss
	}
	return d
}

// debug serves the state as indented JSON. It names replicas and their
// errors: it is served on the admin listener only.
func (s *server) debug(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(s.state())
}
