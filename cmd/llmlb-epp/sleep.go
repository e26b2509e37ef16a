package main

import (
	"sync"

	"github.com/llmlb/llmlb"
)

// sleeping holds the replicas whose engine is asleep
// ([signals.Observation].Asleep, vLLM's sleep mode) out of picks: it marks
// a replica unhealthy on the balancer while the scrape the picker trusts
// says its engine is asleep, and healthy again once one says it is awake
// or none is trusted any longer. A sleeping engine reports no requests, so
// a load-aware policy would send it every request, and vLLM holds them
// until wake_up: since vllm-project/vllm#34528, EngineCore.sleep pauses the
// scheduler first, at every level, and the requests it is sent wait until
// resume_scheduler "flush[es] any requests queued while paused"
// (vllm/v1/engine/core.py; before it, the engine crashed on them, #15483).
// The balancer picks no unhealthy replica while a healthy one is a
// candidate, and when none is, the picker answers 503 (package extproc)
// rather than send the request to an engine that would hold it.
//
// sleeping marks a replica only when its state changes, so that it does
// not undo a mark it did not make. It is the only owner of the marks in
// this command; another (an ejector) would have to be combined with it, as
// package gateway's health combines the two, for neither to undo the
// other. A sleeping needs its b; the map is made on first use. All methods
// are safe for concurrent use.
type sleeping struct {
	b *llmlb.Balancer

	mu     sync.Mutex      // guards asleep, and orders the marks on b
	asleep map[string]bool // the members held out as asleep; lazily initialized
}

// set records whether the engine of replica key is asleep, and marks the
// replica if that changed; it reports whether it did. A key that is not (or
// no longer) a member is forgotten: its next scrape tries again.
func (s *sleeping) set(key string, asleep bool) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.asleep[key] == asleep {
		return false
	}
	if err := s.b.SetHealthy(key, !asleep); err != nil {
		delete(s.asleep, key)
		return false
	}
	if !asleep {
		delete(s.asleep, key)
		return true
	}
	if s.asleep == nil {
		s.asleep = make(map[string]bool)
	}
	s.asleep[key] = true
	return true
}

// is reports whether replica key is held out as asleep.
func (s *sleeping) is(key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.asleep[key]
}

// retain forgets the replicas that are not members, which have left the
// balancer: one that comes back joins it healthy, as a new one does, and
// is held out again by the first scrape that finds it asleep.
func (s *sleeping) retain(members map[string]string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k := range s.asleep {
		if _, ok := members[k]; !ok {
			delete(s.asleep, k)
		}
	}
}
