package engine

import (
	"encoding/binary"
	"time"

	"github.com/llmlb/llmlb/kvevents"
)

// Tokens returns the token IDs the engine counts for text: one token per
// [BytesPerToken] bytes, the ID of each being those bytes read as a
// little-endian integer, and a last partial token if text does not fill
// one. These are the token IDs of the engine's KV events ([Config.KVEvents]),
// so a router that tokenizes prompts with Tokens and hashes them with a
// [prefix.Hasher] of the engine's block size matches what the engine
// reports cached.
func Tokens(text string) []uint32 {
	out := make([]uint32, 0, (len(text)+BytesPerToken-1)/BytesPerToken)
	for len(text) >= BytesPerToken {
		out = append(out, binary.LittleEndian.Uint32([]byte(text[:BytesPerToken])))
		text = text[BytesPerToken:]
	}
	if len(text) > 0 {
		var last [BytesPerToken]byte
		copy(last[:], text)
		out = append(out, binary.LittleEndian.Uint32(last[:]))
	}
	return out
}

// blockInfo is what the engine's KV events report about a prompt block: its
// parent and its tokens. The engine keeps it while a request in progress
// holds the block or the prefix cache does.
type blockInfo struct {
	parent    uint64
	hasParent bool
	tokens    []uint32
	refs      int  // requests in progress whose prompt has the block
	cached    bool // in the prefix cache
}

// track notes the prompt blocks of s, submitted, for its KV events. e.mu
// is held.
func (e *Engine) track(s *seq, text string) {
	if e.kvEvents == nil {
		return
	}
	bb := e.blockSize * BytesPerToken
	for i, h := range s.Prefix {
		b := e.blocks[h]
		if b == nil {
			b = &blockInfo{tokens: Tokens(text[i*bb : (i+1)*bb])}
			if i > 0 {
				b.parent, b.hasParent = s.Prefix[i-1], true
			}
			e.blocks[h] = b
		}
		b.refs++
	}
	s.tracked = true
}

// untrack releases the blocks of s, which left the engine. e.mu is held.
func (e *Engine) untrack(s *seq) {
	if !s.tracked {
		return
	}
	s.tracked = false
	for _, h := range s.Prefix {
		if b := e.blocks[h]; b != nil {
			b.refs--
			if b.refs <= 0 && !b.cached {
				delete(e.blocks, h)
			}
		}
	}
}

// onKVEvent is the replica's KV event handler: it turns a block entering or
// leaving the prefix cache into a vLLM event, merged with the previous one
// where vLLM would have sent one event. e.mu is held.
func (e *Engine) onKVEvent(h uint64, stored bool) {
	b := e.blocks[h]
	if b == nil {
		return
	}
	n := len(e.pending)
	var last *kvevents.Event
	if n > 0 {
		last = &e.pending[n-1]
	}
	if stored {
		b.cached = true
		if last != nil && last.Kind == kvevents.Stored && b.hasParent && last.BlockHashes[len(last.BlockHashes)-1] == b.parent {
			last.BlockHashes = append(last.BlockHashes, h)
			last.TokenIDs = append(last.TokenIDs, b.tokens...)
			return
		}
		e.pending = append(e.pending, kvevents.Event{
			Kind:        kvevents.Stored,
			BlockHashes: []uint64{h},
			Parent:      b.parent,
			HasParent:   b.hasParent,
			TokenIDs:    append([]uint32(nil), b.tokens...),
			BlockSize:   e.blockSize,
			Medium:      "GPU",
		})
		return
	}
	b.cached = false
	if b.refs <= 0 {
		delete(e.blocks, h)
	}
	if last != nil && last.Kind == kvevents.Removed {
		last.BlockHashes = append(last.BlockHashes, h)
		return
	}
	e.pending = append(e.pending, kvevents.Event{Kind: kvevents.Removed, BlockHashes: []uint64{h}, Medium: "GPU"})
}

// flushKVEvents hands the events of the last iteration to Config.KVEvents,
// outside the engine's lock.
func (e *Engine) flushKVEvents() {
	if e.kvEvents == nil {
		return
	}
	e.mu.Lock()
	events := e.pending
	e.pending = nil
	e.mu.Unlock()
	if len(events) > 0 {
		e.kvEvents(&kvevents.Batch{TS: float64(time.Now().UnixNano()) / 1e9, Events: events, DPRank: 0})
	}
}
