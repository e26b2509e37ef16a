package sim

import "github.com/llmlb/llmlb/internal/model"

// The engine model, shared with package engine, lives in package model; these
// names keep the simulator's code in its own terms.
type (
	// Engine models one continuous-batching replica; see [model.Engine].
	Engine = model.Engine
	// Replica is one engine's scheduler and cache; see [model.Replica].
	Replica = model.Replica
	// Sequence is one request inside a Replica; see [model.Sequence].
	Sequence = model.Sequence
)

// Engine defaults; see package model.
const (
	DefaultBlockSize   = model.DefaultBlockSize
	DefaultKVBlocks    = model.DefaultKVBlocks
	DefaultAdapterLoad = model.DefaultAdapterLoad
)

// NewReplica returns an idle replica; see [model.NewReplica].
func NewReplica(eng Engine) (*Replica, error) { return model.NewReplica(eng) }

// MockerPrefillMillis is the prefill part of the default iteration-time
// model; see [model.MockerPrefillMillis].
func MockerPrefillMillis(t int) float64 { return model.MockerPrefillMillis(t) }

// MockerDecodeMillis is its decode part; see [model.MockerDecodeMillis].
func MockerDecodeMillis(u float64) float64 { return model.MockerDecodeMillis(u) }
