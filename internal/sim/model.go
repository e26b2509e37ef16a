package sim

import (
	"time"

	"github.com/llmlb/llmlb/internal/model"
)

// The engine model, shared with package engine, lives in package model; these
// names keep the simulator's code in its own terms.
type (
	// Engine models one continuous-batching replica; see [model.Engine].
	Engine = model.Engine
	// Batch describes one engine iteration; see [model.Batch].
	Batch = model.Batch
	// IterTimeFunc returns how long an iteration takes; see
	// [model.IterTimeFunc].
	IterTimeFunc = model.IterTimeFunc
	// Replica is one engine's scheduler and cache; see [model.Replica].
	Replica = model.Replica
	// Sequence is one request inside a Replica; see [model.Sequence].
	Sequence = model.Sequence
	// ReplicaStats is a snapshot of a Replica; see [model.ReplicaStats].
	ReplicaStats = model.ReplicaStats
)

// Engine defaults; see package model.
const (
	DefaultTokenBudget = model.DefaultTokenBudget
	DefaultMaxRunning  = model.DefaultMaxRunning
	DefaultBlockSize   = model.DefaultBlockSize
	DefaultKVBlocks    = model.DefaultKVBlocks
	DefaultAdapterLoad = model.DefaultAdapterLoad
)

// NewReplica returns an idle replica; see [model.NewReplica].
func NewReplica(eng Engine) (*Replica, error) { return model.NewReplica(eng) }

// MockerIterTime is the default iteration-time model; see
// [model.MockerIterTime].
func MockerIterTime(b Batch) time.Duration { return model.MockerIterTime(b) }

// MockerPrefillMillis is the prefill part of MockerIterTime; see
// [model.MockerPrefillMillis].
func MockerPrefillMillis(t int) float64 { return model.MockerPrefillMillis(t) }

// MockerDecodeMillis is the decode part of MockerIterTime; see
// [model.MockerDecodeMillis].
func MockerDecodeMillis(u float64) float64 { return model.MockerDecodeMillis(u) }
