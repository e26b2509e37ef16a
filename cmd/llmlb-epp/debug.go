package main

import (
	"encoding/json"
	"math"
	"net/http"
	"time"

	"github.com/llmlb/llmlb/extproc"
	"github.com/llmlb/llmlb/gateway"
)

// debugState is the JSON document /debug/llmlb serves; its per-replica
// signal, scrape and sharing views are those of package gateway's.
type debugState struct {
	Time     time.Time           `json:"time"`
	Protocol string              `json:"protocol"`
	Policy   string              `json:"policy"`
	Source   debugSource         `json:"source"`
	Ready    bool                `json:"ready"` // what the readiness health check reports
	InFlight *int                `json:"admission_in_flight,omitempty"`
	Sessions *int                `json:"admission_sessions,omitempty"`
	Share    *gateway.DebugShare `json:"share,omitempty"` // absent without -nats
	Replicas []debugEndpoint     `json:"endpoints"`
}

type debugSource struct {
	Kind      string    `json:"kind"` // endpoints, file or dns
	Loaded    time.Time `json:"loaded,omitzero"`
	LastError string    `json:"last_error,omitempty"`
}

type debugEndpoint struct {
	Key           string               `json:"key"`
	Healthy       bool                 `json:"healthy"`          // false while asleep
	Asleep        bool                 `json:"asleep,omitempty"` // the trusted scrape says the engine is asleep
	Outstanding   int64                `json:"outstanding"`
	Queued        int64                `json:"queued"`
	PrefillTokens int64                `json:"prefill_tokens"`
	DecodeTokens  int64                `json:"decode_tokens"`
	Signal        *gateway.DebugSignal `json:"signal,omitempty"`
	Scrape        *gateway.DebugScrape `json:"scrape,omitempty"`
	IndexBlocks   int                  `json:"index_blocks"`
	EventBlocks   *int                 `json:"event_blocks,omitempty"`
}

// state returns the picker's state for the debug view.
func (s *server) state() debugState {
	now := time.Now()
	st := s.members.status()
	s.readyMu.Lock()
	ready := st.synced && !s.draining
	s.readyMu.Unlock()
	d := debugState{Time: now, Protocol: extproc.ProtocolVersion, Policy: s.o.policy, Ready: ready, Replicas: []debugEndpoint{}}
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
		d.Share = &gateway.DebugShare{ID: s.group.ID(), Connected: gs.Connected, Peers: gs.Peers, Published: gs.Published,
			Unpublished: gs.Unpublished, Received: gs.Received, Rejected: gs.Rejected, Dropped: gs.Dropped}
	}
	d.Source.Loaded = st.loaded
	if st.err != nil {
		d.Source.LastError = st.err.Error()
	}
	for _, e := range s.b.Stats() {
		de := debugEndpoint{Key: e.Key, Healthy: e.Healthy, Outstanding: e.Outstanding, Queued: e.Queued,
			PrefillTokens: e.PrefillTokens, DecodeTokens: e.DecodeTokens, IndexBlocks: s.ix.Len(e.Key)}
		if s.sleep != nil {
			de.Asleep = s.sleep.is(e.Key)
		}
		if s.scraper != nil {
			if o, ok := s.scraper.Observation(e.Key); ok && !o.At.IsZero() {
				sig := &gateway.DebugSignal{AgeSeconds: now.Sub(o.At).Seconds(), Running: o.Running, Waiting: o.Waiting, Engine: o.Engine.String()}
				if !math.IsNaN(o.KVUsage) {
					u := o.KVUsage
					sig.KVUsage = &u
				}
				de.Signal = sig
			}
			if ss, ok := s.scraper.Status(e.Key); ok {
				de.Scrape = &gateway.DebugScrape{Scrapes: ss.Scrapes, Failures: ss.Failures, ConsecutiveFailures: ss.ConsecutiveFailures}
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
