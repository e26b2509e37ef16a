// Package prefix hashes prompt heads into chained block hashes and indexes
// which endpoints hold which blocks in their prefix (KV) cache.
//
// A [Hasher] cuts a prompt into fixed-size blocks — BlockTokens tokens in
// token mode, BlockBytes bytes of text in byte mode for routers that do not
// tokenize — and hashes each full block chained to the hash of the block
// before it, starting from a root derived from a [Salt] (model, LoRA
// adapter, cache namespace, reasoning effort and, unless
// [HasherConfig.ShareAcrossTenants] is set, the tenant). Two prompts share
// their first k hashes exactly when they share their first k blocks and their
// salt, so a prompt's hashes identify every prefix of it. Only the first
// MaxTokens/BlockTokens blocks are hashed. The hashes go into
// llmlb.Request.Prefix.
//
// An [Index] maps endpoints (by key) to the block hashes they are believed
// to hold, in one LRU per endpoint bounded by a capacity that can be sized
// from the engine's KV-cache block count, so its memory is bounded by the sum
// of the capacities times [BytesPerBlock] while it fills, and by about 1.6
// times that once capacities were lowered or endpoints removed (see
// BytesPerBlock). It is fed approximately, with
// [Index.Record] after each routing decision (entries expire after a TTL,
// and a Record drops expired ones, so a router's index holds about what it
// recorded within the TTL however long it runs), or
// precisely, from the engine's KV events with [Index.Stored],
// [Index.Removed] and [Index.Cleared]; the transport of those events (ZMQ,
// NATS) is the caller's. A prefix is recorded tail first so that its head is
// the last block evicted. [Index.Match] returns, in one pass over a prompt's
// blocks, the longest cached prefix on every endpoint; an endpoint's match
// stops at its first missing block.
//
// A typical prefix-aware policy hashes the prompt once, calls Match to
// score endpoints, picks one, and calls Record for it:
//
//	h, _ := prefix.NewHasher(prefix.HasherConfig{})
//	idx, _ := prefix.NewIndex(prefix.IndexConfig{BlockSize: h.BlockTokens()})
//	blocks := h.AppendTokens(buf[:0], h.Root(salt), tokens)
//	matches := idx.Match(blocks, now, matchBuf[:0])
//	// ... choose an endpoint, then:
//	_ = idx.Record(chosen, blocks, now)
//
// Hashers are immutable and an Index takes locks while operating, so both are
// safe for concurrent use. Nothing in this package starts a goroutine; time
// is always passed in by the caller.
//
// This package's plain data types (HasherConfig, IndexConfig, Match, Salt)
// hold no lock: any number of goroutines may read a value of one at once,
// but none may write it meanwhile.
package prefix
