package model

import (
	"fmt"
	"slices"
)

// receive moves s, whose KV arrived, from the receiving sequences to the
// running batch, its prompt computed and its blocks in the prefix cache.
func (r *Replica) Receive(s *Sequence) {
	i := slices.Index(r.receiving, s)
	if i < 0 {
		panic(fmt.Sprintf("sim: internal error: sequence %d is not receiving", s.ID))
	}
	r.receiving = slices.Delete(r.receiving, i, i+1)
	s.computed = s.target
	s.remote = false
	r.publish(s)
	r.kv.flush()
	s.state = StateRunning
	r.running = append(r.running, s)
	r.lanes = append(r.lanes, lane{})
}
