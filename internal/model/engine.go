package model

import (
	"errors"
	"fmt"
	"time"
)

// Sentinel errors; errors returned by this package wrap one of them.
var (
	// ErrInvalidConfig: an Engine field is out of range.
	ErrInvalidConfig = errors.New("sim: invalid config")
	// ErrInvalidWorkload: a Sequence is invalid.
	ErrInvalidWorkload = errors.New("sim: invalid workload")
)

// maxTokens bounds token counts so that sums cannot overflow.
const maxTokens = 1 << 24

// Engine defaults.
const (
	// DefaultTokenBudget is the tokens an iteration processes when
	// [Engine.TokenBudget] is 0.
	DefaultTokenBudget = 8192
	// DefaultMaxRunning is the running batch's size limit when
	// [Engine.MaxRunning] is 0.
	DefaultMaxRunning = 256
	// DefaultBlockSize is the tokens per KV block when [Engine.BlockSize]
	// is 0.
	DefaultBlockSize = 16
	// DefaultKVBlocks is the KV capacity of a replica: 8192 blocks of 16
	// tokens, 131,072 tokens. It is deliberately small, so that KV
	// pressure, eviction of cached prefixes and preemption all occur (the
	// prefixes scenario uses it); raise it for long-context traces.
	DefaultKVBlocks = 8192
	// DefaultAdapterLoad is the stall of loading a LoRA adapter into a
	// slot when [Engine.AdapterLoad] is 0: copying a rank-16 adapter of an
	// 8B model (tens of MB) from host memory takes milliseconds, reading it
	// from disk first (an adapter beyond vLLM's --max-cpu-loras) tens to
	// hundreds; 50 ms is in between.
	DefaultAdapterLoad = 50 * time.Millisecond
)

// Engine models one continuous-batching replica. The zero value is the
// default engine.
type Engine struct {
	// TokenBudget is the number of tokens one iteration processes, prefill
	// chunks and decode tokens together (chunked prefill). 0 means
	// [DefaultTokenBudget].
	TokenBudget int
	// MaxRunning is the maximum number of sequences in the running batch.
	// 0 means [DefaultMaxRunning].
	MaxRunning int
	// KVBlocks is the KV-cache capacity in blocks. 0 means [DefaultKVBlocks].
	KVBlocks int
	// BlockSize is the number of tokens per KV block. 0 means
	// [DefaultBlockSize].
	BlockSize int
	// IterTime is the iteration-time model. nil means [MockerIterTime].
	IterTime IterTimeFunc
	// AdapterSlots is the number of LoRA adapters the replica serves at
	// once (vLLM's --max-loras): a waiting request whose adapter is not in
	// a slot is admitted only when a slot is free or holds an adapter no
	// running request uses, which it then reclaims, least recently used
	// first; requests that cannot get a slot are skipped in favour of later
	// ones, as vLLM's scheduler does. 0 means adapters are not modelled:
	// [Request].Adapter is ignored.
	AdapterSlots int
	// AdapterLoad is the stall of loading an adapter into a slot, added to
	// the iteration that admits its first request. 0 means
	// [DefaultAdapterLoad] when AdapterSlots is set.
	AdapterLoad time.Duration
}

func (e *Engine) Normalize() error {
	if e.TokenBudget == 0 {
		e.TokenBudget = DefaultTokenBudget
	}
	if e.MaxRunning == 0 {
		e.MaxRunning = DefaultMaxRunning
	}
	if e.KVBlocks == 0 {
		e.KVBlocks = DefaultKVBlocks
	}
	if e.BlockSize == 0 {
		e.BlockSize = DefaultBlockSize
	}
	if e.IterTime == nil {
		e.IterTime = MockerIterTime
	}
	if e.AdapterSlots > 0 && e.AdapterLoad == 0 {
		e.AdapterLoad = DefaultAdapterLoad
	}
	switch {
	case e.TokenBudget < 1 || e.TokenBudget > maxTokens:
		return fmt.Errorf("%w: token budget %d", ErrInvalidConfig, e.TokenBudget)
	case e.MaxRunning < 1:
		return fmt.Errorf("%w: max running %d", ErrInvalidConfig, e.MaxRunning)
	case e.KVBlocks < 1 || e.KVBlocks > maxTokens:
		return fmt.Errorf("%w: KV blocks %d", ErrInvalidConfig, e.KVBlocks)
	case e.BlockSize < 1 || e.BlockSize > 1<<16:
		return fmt.Errorf("%w: block size %d", ErrInvalidConfig, e.BlockSize)
	case e.AdapterSlots < 0 || e.AdapterSlots > 1<<16:
		return fmt.Errorf("%w: %d adapter slots", ErrInvalidConfig, e.AdapterSlots)
	case e.AdapterLoad < 0 || e.AdapterLoad > time.Minute:
		return fmt.Errorf("%w: adapter load time %v, want 0 to 1m", ErrInvalidConfig, e.AdapterLoad)
	}
	return nil
}
