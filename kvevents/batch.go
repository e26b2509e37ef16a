package kvevents

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"unsafe"

	"github.com/cespare/xxhash/v2"
	"github.com/vmihailenco/msgpack/v5"
)

// Limits on one decoded batch. A payload beyond any of them is rejected as
// malformed. Within them, the memory of a decoded batch follows its
// payload: its block hashes and token IDs take at most 12 bytes per byte
// of payload, 8 in the worst case known (every block hash a 1-byte
// integer, which becomes an 8-byte uint64), and its events 200 bytes
// each, at most 16 bytes per byte of payload (every event the shortest
// one, 13 bytes); decoding allocates a small multiple of that as the
// storage grows (twice in the worst case known, 16 bytes per byte of
// payload), and reserves the storage of the events at once.
const (
	// MaxPayloadBytes is the largest payload decoded: 64 MiB.
	MaxPayloadBytes = 64 << 20
	// MaxEventsPerBatch is the most events one batch may hold. vLLM and
	// SGLang publish one batch per scheduler step, with a few events per
	// request in it.
	MaxEventsPerBatch = 1 << 16
	// MaxBlocksPerEvent is the most block hashes one event may hold: a
	// million tokens at 16 tokens a block.
	MaxBlocksPerEvent = 1 << 16
	// MaxTokensPerEvent is the most token IDs one event may hold.
	MaxTokensPerEvent = 1 << 22
)

// ErrMalformed: a payload is not a KV event batch in any known encoding, or
// exceeds a limit. Every decoding error wraps it.
var ErrMalformed = errors.New("kvevents: malformed batch")

// Kind is the type of an [Event]. It is a plain value, safe to use from any
// goroutine.
type Kind uint8

// Event kinds, named after vLLM's event classes.
const (
	// Stored is BlockStored: the engine cached new blocks.
	Stored Kind = iota + 1
	// Removed is BlockRemoved: the engine evicted blocks.
	Removed
	// Cleared is AllBlocksCleared: the engine dropped its whole cache.
	Cleared
)

// String returns the event class name used on the wire.
func (k Kind) String() string {
	switch k {
	case Stored:
		return "BlockStored"
	case Removed:
		return "BlockRemoved"
	case Cleared:
		return "AllBlocksCleared"
	}
	return "Kind(" + strconv.Itoa(int(k)) + ")"
}

// Event is one KV-cache event of an engine.
type Event struct {
	// Kind is the type of the event.
	Kind Kind
	// BlockHashes are the engine's hashes of the blocks stored or removed,
	// in prompt order. Engines send them as integers (kept as their 64-bit
	// two's-complement bits) or as bytes (folded to 64 bits with XXH64).
	BlockHashes []uint64
	// Parent is the engine's hash of the block preceding the first stored
	// block, when HasParent is set; a Stored event without a parent starts
	// at the head of a prompt.
	Parent    uint64
	HasParent bool
	// TokenIDs are the tokens of the stored blocks, BlockSize per block;
	// empty when the engine sends pairs of token IDs instead (SGLang's
	// bigram pages, with EAGLE speculative decoding).
	TokenIDs []uint32
	// BlockSize is the number of tokens per block of a Stored event.
	BlockSize int
	// LoRA names the LoRA adapter of the stored blocks: vLLM's lora_name,
	// or its lora_id in decimal when only that is sent; "" for none.
	LoRA string
	// Medium is where the blocks live ("GPU", "CPU", ...); "" when the
	// engine does not say, which means GPU memory.
	Medium string
	// Group is the KV-cache group of the blocks (vLLM's group_idx, for
	// models mixing attention types); 0 when not sent.
	Group int
	// GroupKind is the attention type of the blocks' KV-cache group, as
	// vLLM names it (kv_cache_spec_kind: "full_attention",
	// "mla_attention", "sink_full_attention", "sliding_window", "mamba",
	// ...); "" when not sent.
	GroupKind string
	// CacheSalt is the cache salt the engine mixed into the hash of the
	// first stored block (a request's cache_salt: vLLM sends it in
	// extra_keys, SGLang as cache_salt), set only on an event without a
	// parent: blocks with a parent continue its chain, salt included. ""
	// for none. Salted blocks are indexed under the [prefix.Salt] whose
	// Namespace is the cache salt, and match only the prompts the router
	// hashes with it.
	CacheSalt string
	// Salted reports that the engine mixed keys other than the LoRA name
	// and the cache salt into the stored blocks' hashes (vLLM's
	// extra_keys: multimodal inputs, prompt embeddings), or keys this
	// package cannot place, so the token IDs alone do not identify the
	// blocks.
	Salted bool

	// remote is set when the engine reports the blocks REMOTE relative to
	// itself (vLLM's locality, "LOCAL or REMOTE relative to the publisher";
	// vllm/distributed/kv_events.py, 2026), or a locality this package
	// does not know: they are not known to be in its own memory, so they
	// are neither indexed nor removed from the index.
	remote bool
	// newer is set on a BlockStored whose event_version is newer than
	// maxEventVersion: its fields may mean what this package does not
	// know, so its blocks are not indexed (see maxEventVersion).
	newer bool
}

// maxEventVersion is the newest event_version of a BlockStored this
// package knows. vLLM's BlockStored sends none; event_version 1 was
// proposed with the typed extra keys ({"type": "lora", "name": ...} and
// the like, which extraKeys reads) in vllm-project/vllm#55488, to be
// "incremented whenever the semantics of a field (or of extra_keys)
// change in a way consumers must branch on". A BlockStored of a newer
// version is decoded, its blocks are not indexed, and it is counted in
// [Stats].Unknown.
const maxEventVersion = 1

// Batch is one message of an engine's KV event stream: the events of one
// scheduler step.
type Batch struct {
	// TS is the time the batch was made, in seconds since the Unix epoch.
	TS float64
	// Events are the batch's events, in order.
	Events []Event
	// DPRank is the data-parallel rank of the publisher (vLLM's
	// data_parallel_rank, SGLang's attn_dp_rank), from 0 up, or -1 when
	// not sent. [DecodeBatch] refuses a batch with any other negative
	// rank, or one above 2^31-1; [AppendBatch] writes such a rank as
	// none.
	DPRank int

	// unknown counts the events of an unknown class the last DecodeBatch
	// dropped.
	unknown int

	// Storage reused by DecodeBatch.
	hashes []uint64
	tokens []uint32
	spans  []eventSpans
}

// eventSpans locates an event's slices in Batch.hashes and Batch.tokens
// while decoding, before those are final.
type eventSpans struct {
	h0, h1, t0, t1 int32  // below MaxPayloadBytes, which bounds the elements
	extra          []byte // raw extra_keys value, read once LoRA and parent are known
}

// DecodeBatch decodes payload into b, reusing the storage of b's slices: the
// slices of an earlier decode into b are overwritten. It accepts both
// encodings vLLM and SGLang have used, positional arrays (vLLM up to mid
// 2026, SGLang up to sgl-project/sglang#37482) and maps keyed by field
// name with the class under "type" (vLLM since PR 42892, SGLang since),
// for the batch and for each event. Trailing fields missing from a
// positional event take their zero values, fields it does not know are
// skipped, and events of an unknown class are dropped whatever their fields
// hold (a Subscriber or Applier counts them in [Stats].Unknown), so that
// engines older or newer than this package decode alike; a BlockStored of
// an event_version newer than it knows is decoded, and counted there too.
// On error, which wraps [ErrMalformed], b holds no events.
//
// A Batch reused for every batch of a stream keeps the storage of the
// largest batch decoded into it only as long as the batches that follow
// use a good part of it: storage over 1 MiB that holds less than a quarter
// of the last batch's events, hashes or tokens is given back.
func DecodeBatch(b *Batch, payload []byte) error {
	used := len(b.Events)
	b.TS, b.DPRank, b.unknown = 0, -1, 0
	b.Events, b.hashes, b.tokens, b.spans = b.Events[:0], b.hashes[:0], b.tokens[:0], b.spans[:0]
	err := b.decode(payload)
	if err != nil {
		clear(b.Events[:max(used, len(b.Events))])
		clear(b.spans)
		b.Events, b.hashes, b.tokens, b.spans = b.Events[:0], b.hashes[:0], b.tokens[:0], b.spans[:0]
		b.unknown = 0
	} else {
		// The events past the new ones still point into the storage of
		// earlier batches.
		clear(b.Events[len(b.Events):max(used, len(b.Events))])
	}
	b.Events = shrink(b.Events, eventBytes)
	b.spans = shrink(b.spans, spanBytes)
	b.hashes = shrink(b.hashes, 8)
	b.tokens = shrink(b.tokens, 4)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	for i := range b.Events {
		e, s := &b.Events[i], &b.spans[i]
		e.BlockHashes = b.hashes[s.h0:s.h1:s.h1]
		e.TokenIDs = b.tokens[s.t0:s.t1:s.t1]
		if s.extra != nil {
			salt, other := extraKeys(s.extra, e.LoRA, e.CacheSalt, !e.HasParent)
			e.Salted = e.Salted || other
			switch {
			case salt == "":
			case e.CacheSalt == "":
				e.CacheSalt = salt
			case e.CacheSalt != salt:
				e.Salted = true // two salts: SGLang's cache_salt and extra_keys disagree
			}
			s.extra = nil
		}
		if e.HasParent {
			e.CacheSalt = "" // the parent's chain carries it
		}
	}
	return nil
}

func (b *Batch) decode(payload []byte) error {
	if len(payload) > MaxPayloadBytes {
		return fmt.Errorf("payload of %d bytes exceeds %d", len(payload), MaxPayloadBytes)
	}
	r := &reader{b: payload}
	var err error
	switch {
	case r.isArray():
		var n int
		if n, err = r.arrayLen(); err != nil {
			return err
		}
		if n < 2 {
			return errors.New("batch array shorter than [ts, events]")
		}
		if b.TS, err = r.float(); err != nil {
			return fmt.Errorf("ts: %w", err)
		}
		if err = b.decodeEvents(r); err != nil {
			return err
		}
		if n > 2 {
			if b.DPRank, err = dpRank(r); err != nil {
				return fmt.Errorf("data_parallel_rank: %w", err)
			}
		}
		for range n - min(n, 3) {
			if err = r.skip(1); err != nil {
				return err
			}
		}
	case r.isMap():
		var n int
		if n, err = r.mapLen(); err != nil {
			return err
		}
		for range n {
			k, err := r.raw()
			if err != nil {
				return fmt.Errorf("batch key: %w", err)
			}
			switch string(k) {
			case "ts":
				b.TS, err = r.float()
			case "events":
				err = b.decodeEvents(r)
			case "data_parallel_rank", "attn_dp_rank":
				b.DPRank, err = dpRank(r)
			default:
				err = r.skip(1)
			}
			if err != nil {
				return fmt.Errorf("batch field %q: %w", k, err)
			}
		}
	default:
		return errors.New("batch is neither an array nor a map")
	}
	if r.off != len(payload) {
		return errors.New("trailing bytes after the batch")
	}
	return nil
}

func (b *Batch) decodeEvents(r *reader) error {
	if r.isNil() {
		return nil
	}
	n, err := r.arrayLen()
	if err != nil {
		return fmt.Errorf("events: %w", err)
	}
	if n > MaxEventsPerBatch {
		return fmt.Errorf("%d events exceed %d", n, MaxEventsPerBatch)
	}
	// Room for every event the bytes left can hold, at once: grown by
	// append, the storage of a batch of many small events would be
	// allocated over and over, about five times its final size in all.
	most := (len(r.b) - r.off) / minEventBytes
	b.Events = grow(b.Events, min(n, most), most)
	b.spans = grow(b.spans, min(n, most), most)
	for i := range n {
		var e Event
		var s eventSpans
		if err := b.decodeEvent(r, &e, &s); err != nil {
			return fmt.Errorf("event %d: %w", i, err)
		}
		if e.Kind != Stored {
			e.newer = false // event_version is BlockStored's
		}
		if e.newer {
			b.unknown++ // kept, so that its blocks count as skipped
		}
		if e.Kind != 0 {
			b.Events = append(b.Events, e)
			b.spans = append(b.spans, s)
		} else {
			b.hashes, b.tokens = b.hashes[:s.h0], b.tokens[:s.t0]
			b.unknown++
		}
	}
	return nil
}

// minEventBytes is the size of the shortest event of a known class:
// ["BlockStored"], a fixarray header, a fixstr header and 11 bytes. A map
// ({"type": "BlockStored"}) takes 18.
const minEventBytes = 13

// Positional field order of each event class, after the tag. vLLM's
// BlockStored and BlockRemoved as their last positional encoding had them
// (vllm/distributed/kv_events.py before vllm-project/vllm#42892, which
// lists the PRs that appended each field: lora_id #16750, medium #19737,
// lora_name #27577, extra_keys #33304, group_idx #37688,
// kv_cache_spec_kind and kv_cache_spec_sliding_window #40984) are the
// first eleven and three; the layout KV-aware routers read by position
// then has locality and ownership on both, and kv_cache_spec_kind and
// kv_cache_spec_sliding_window on BlockRemoved too (SGLang's
// TestBlockStoredWireFormat pins it: test/registered/unit/disaggregation/
// test_kv_events.py, 2026; Dynamo reads the same in
// lib/kv-router/src/zmq_wire/deserialize.rs). SGLang's positional
// BlockStored has the same first six, then, when salted, a map
// {"cache_salt": ...} (BlockStoredWithMetadata, sgl-project/sglang#30827):
// first where vLLM has lora_name, the value's type telling the two apart
// (a string or nil for vLLM, a map for SGLang), then, in the routers'
// layout, after ownership.
var (
	storedFields = [...]string{"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium",
		"lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window",
		"locality", "ownership", "metadata"}
	removedFields = [...]string{"block_hashes", "medium", "group_idx", "kv_cache_spec_kind",
		"kv_cache_spec_sliding_window", "locality", "ownership"}
)

// decodeEvent decodes one event; e.Kind stays 0 for an unknown class.
func (b *Batch) decodeEvent(r *reader, e *Event, s *eventSpans) error {
	s.h0, s.h1, s.t0, s.t1 = int32(len(b.hashes)), int32(len(b.hashes)), int32(len(b.tokens)), int32(len(b.tokens))
	if r.isMap() {
		n, err := r.mapLen()
		if err != nil {
			return err
		}
		// The class is under "type", which msgspec writes first. The fields
		// of a class this package does not know are skipped, whatever they
		// hold: a newer engine's event may reuse a field name with another
		// type, and it must not cost the batch's other events. Fields that
		// come before "type" are decoded on their own, and an error in one
		// counts only once the class is known.
		typed, known := false, true
		var early error
		for range n {
			k, err := r.raw()
			if err != nil {
				return fmt.Errorf("key: %w", err)
			}
			switch {
			case string(k) == "type":
				tag, err := r.raw()
				if err != nil {
					return fmt.Errorf("type: %w", err)
				}
				e.Kind, known = kindOf(tag)
				typed = true
			case !known:
				err = r.skip(1)
			case !typed:
				start := r.off
				if err = r.skip(1); err == nil && early == nil {
					if ferr := b.decodeField(&reader{b: r.b[:r.off], off: start}, string(k), e, s); ferr != nil {
						early = fmt.Errorf("field %q: %w", k, ferr)
					}
				}
			default:
				if err = b.decodeField(r, string(k), e, s); err != nil {
					err = fmt.Errorf("field %q: %w", k, err)
				}
			}
			if err != nil {
				return err
			}
		}
		if !known || !typed {
			e.Kind = 0
			return nil
		}
		return early
	}
	n, err := r.arrayLen()
	if err != nil {
		return err
	}
	if n == 0 {
		return errors.New("empty event")
	}
	tag, err := r.raw()
	if err != nil {
		return fmt.Errorf("tag: %w", err)
	}
	kind, known := kindOf(tag)
	var fields []string
	switch kind {
	case Stored:
		fields = storedFields[:]
	case Removed:
		fields = removedFields[:]
	}
	for i := range n - 1 {
		name := ""
		if known && i < len(fields) {
			name = fields[i]
		}
		if err := b.decodeField(r, name, e, s); err != nil {
			return fmt.Errorf("field %d (%s): %w", i+1, name, err)
		}
	}
	if known {
		e.Kind = kind
	}
	return nil
}

func kindOf(tag []byte) (Kind, bool) {
	switch string(tag) {
	case "BlockStored":
		return Stored, true
	case "BlockRemoved":
		return Removed, true
	case "AllBlocksCleared":
		return Cleared, true
	}
	return 0, false
}

// decodeField decodes the field called name into e, or skips it.
func (b *Batch) decodeField(r *reader, name string, e *Event, s *eventSpans) error {
	var err error
	switch name {
	case "block_hashes":
		s.h0 = int32(len(b.hashes))
		err = b.decodeHashes(r)
		s.h1 = int32(len(b.hashes))
	case "parent_block_hash":
		if !r.isNil() {
			e.Parent, err = blockHash(r)
			e.HasParent = err == nil
		}
	case "token_ids":
		s.t0 = int32(len(b.tokens))
		err = b.decodeTokens(r)
		s.t1 = int32(len(b.tokens))
	case "block_size":
		var v int
		if v, err = optInt(r, 0); err == nil && (v < 0 || v > math.MaxInt32) {
			err = fmt.Errorf("block size %d out of range", v)
		}
		e.BlockSize = v
	case "lora_id":
		var v int
		if v, err = optInt(r, math.MinInt); err == nil && v != math.MinInt && e.LoRA == "" {
			e.LoRA = strconv.Itoa(v)
		}
	case "lora_name":
		switch {
		case r.isMap():
			// SGLang's positional BlockStoredWithMetadata has its metadata
			// here.
			return b.decodeField(r, "metadata", e, s)
		case r.isArray():
			// An engine that appends extra_keys after medium, as
			// sgl-project/sglang#27735 proposes: no string is an array.
			return b.decodeField(r, "extra_keys", e, s)
		}
		if !r.isNil() {
			var p []byte
			if p, err = r.raw(); err == nil && len(p) > 0 {
				e.LoRA = string(p)
			}
		}
	case "medium":
		if !r.isNil() {
			var p []byte
			if p, err = r.raw(); err == nil {
				e.Medium = intern(p)
			}
		}
	case "extra_keys":
		start := r.off
		if err = r.skip(1); err == nil && r.b[start] != mpNil {
			s.extra = r.b[start:r.off]
		}
	case "cache_salt":
		// SGLang's, on BlockStored since sgl-project/sglang#37482 (a
		// string, nil or absent for none): it seeds the engine's hash chain
		// (#30827).
		err = cacheSalt(r, e)
	case "metadata":
		// SGLang's positional BlockStoredWithMetadata (#30827):
		// {"cache_salt": ...}; session_id, added later, is not hashed.
		err = metadata(r, e)
	case "event_version":
		var v int
		if v, err = optInt(r, 0); err == nil && v > maxEventVersion {
			e.newer = true
		}
	case "group_idx":
		if e.Group, err = optInt(r, 0); err == nil && e.Group < 0 {
			err = fmt.Errorf("group %d is negative", e.Group)
		}
	case "kv_cache_spec_kind": // vLLM's, since vllm-project/vllm#40984
		if !r.isNil() {
			var p []byte
			if p, err = r.raw(); err == nil {
				e.GroupKind = intern(p)
			}
		}
	case "locality":
		// vLLM's: "LOCAL" or "REMOTE" relative to the engine, nil for
		// unspecified. Any other value, of any type, is not known to be
		// the engine's own memory.
		switch c, perr := r.peek(); {
		case perr != nil:
			err = perr
		case r.isNil():
		case isStr(c):
			var p []byte
			if p, err = r.raw(); err == nil && !strings.EqualFold(string(p), "LOCAL") {
				e.remote = true
			}
		default:
			e.remote = true
			err = r.skip(1)
		}
	default:
		err = r.skip(1)
	}
	return err
}

func (b *Batch) decodeHashes(r *reader) error {
	if r.isNil() {
		return nil
	}
	n, err := r.arrayLen()
	if err != nil {
		return err
	}
	if n > MaxBlocksPerEvent {
		return fmt.Errorf("%d block hashes exceed %d", n, MaxBlocksPerEvent)
	}
	b.hashes = grow(b.hashes, n, len(r.b)-r.off)
	for range n {
		h, err := blockHash(r)
		if err != nil {
			return err
		}
		b.hashes = append(b.hashes, h)
	}
	return nil
}

func (b *Batch) decodeTokens(r *reader) error {
	if r.isNil() {
		return nil
	}
	n, err := r.arrayLen()
	if err != nil {
		return err
	}
	if n > MaxTokensPerEvent {
		return fmt.Errorf("%d token IDs exceed %d", n, MaxTokensPerEvent)
	}
	if n > 0 && r.isArray() {
		// SGLang's bigram pages (EAGLE speculative decoding): pairs of
		// token IDs, which the router does not hash. The event keeps no
		// tokens, and is not indexed.
		for range n {
			if err := r.skip(1); err != nil {
				return err
			}
		}
		return nil
	}
	b.tokens = grow(b.tokens, n, len(r.b)-r.off)
	for range n {
		v, neg, err := r.integer()
		if err != nil {
			return err
		}
		if neg || v > math.MaxUint32 {
			return fmt.Errorf("token ID %d out of range", int64(v))
		}
		b.tokens = append(b.tokens, uint32(v))
	}
	return nil
}

// grow returns s with room for n more elements. It at least doubles the
// storage, so that the many arrays of a batch are not copied over and over,
// but reserves no more than most elements past len(s): the bytes left in
// the payload, of which each element takes one at least.
func grow[T any](s []T, n, most int) []T {
	if cap(s)-len(s) >= n {
		return s
	}
	out := make([]T, len(s), len(s)+max(n, min(len(s), most)))
	copy(out, s)
	return out
}

// shrinkBytes is the storage a Batch keeps for each of its slices however
// little the last batch used of it.
const shrinkBytes = 1 << 20

// Sizes in bytes of an Event and of an eventSpans, for shrink.
const (
	eventBytes = int(unsafe.Sizeof(Event{}))
	spanBytes  = int(unsafe.Sizeof(eventSpans{}))
)

// shrink returns s, or a copy of it in storage of its own length when s's
// storage (of elements of size bytes) exceeds shrinkBytes and four times
// its length, so that a Batch reused for a whole stream does not keep the
// storage of its largest batch for ever.
func shrink[T any](s []T, size int) []T {
	if cap(s)*size <= shrinkBytes || cap(s) <= 4*len(s) {
		return s
	}
	if len(s) == 0 {
		return nil
	}
	return append(make([]T, 0, len(s)), s...)
}

// blockHash reads an engine block hash: an integer or a byte string.
func blockHash(r *reader) (uint64, error) {
	if c, err := r.peek(); err == nil && (c >= 0xa0 && c <= 0xbf || c == mpBin8 || c == mpBin16 || c == mpBin32 || c == mpStr8 || c == mpStr16 || c == mpStr32) {
		p, err := r.raw()
		return xxhash.Sum64(p), err
	}
	v, _, err := r.integer()
	return v, err
}

// optInt reads an integer that fits an int, or nil as def.
func optInt(r *reader, def int) (int, error) {
	if r.isNil() {
		return def, nil
	}
	v, neg, err := r.integer()
	if err != nil {
		return 0, err
	}
	if !neg && v > math.MaxInt64 {
		return 0, errors.New("integer out of range")
	}
	return int(int64(v)), nil
}

// maxDPRank bounds a data-parallel rank: far beyond any deployment, and
// an int on every platform.
const maxDPRank = math.MaxInt32

// dpRank reads a batch's data-parallel rank: nil, or -1 as some publishers
// write it, for none (-1). vLLM's KVEventBatch.data_parallel_rank
// (vllm/distributed/kv_events.py) is int | None, and the publisher sets it
// to the engine's rank, from 0 up (parallel_config.data_parallel_rank), as
// SGLang sets attn_dp_rank; any other negative number, or one beyond
// maxDPRank, is refused rather than passed on as a rank.
func dpRank(r *reader) (int, error) {
	if r.isNil() {
		return -1, nil
	}
	v, neg, err := r.integer()
	switch {
	case err != nil:
		return 0, err
	case neg && int64(v) == -1:
		return -1, nil
	case neg:
		return 0, fmt.Errorf("rank %d is negative (a rank is from 0 up, -1 or nil for none)", int64(v))
	case v > maxDPRank:
		return 0, fmt.Errorf("rank %d exceeds %d", v, maxDPRank)
	}
	return int(v), nil
}

// extraKeys reads the raw extra_keys value of a BlockStored whose LoRA
// adapter is lora and whose own cache salt field (SGLang's) is own, first
// telling whether it starts a chain (has no parent). It returns the cache
// salt it holds, and reports whether it holds a key that is neither the
// adapter nor a salt.
//
// vLLM sends one entry per block: nil, or the tuple of the keys its hash
// mixed in, in the order generate_block_hash_extra_keys
// (vllm/v1/core/kv_cache_utils.py) puts them: the LoRA name (every block
// of an adapter's), multimodal inputs ([identifier, offset] pairs), the
// request's cache_salt (the first block of a request only), prompt
// embedding hashes (bytes). The keys are bare values, or, as
// vllm-project/vllm#55488 proposed with event_version 1, tagged maps:
// {"type": "lora", "name": NAME}, {"type": "cache_salt", "salt": SALT},
// and other tags ("mm", "prompt_embeds", "legacy") for the rest. So the
// adapter is the first string equal to lora in each entry, and the salt
// any other string in the first entry of a chain's first block.
//
// SGLang, in the layout KV-aware routers read by position, copies the
// cache salt of its metadata (own) into extra_keys, tagged as Dynamo tags
// the salts it hands vLLM: dynamoSaltTag + own, in every salted event
// (cache_salt_extra_keys in python/sglang/srt/disaggregation/kv_events.py,
// 2026). A key equal to that is the event's own salt again, wherever it
// comes.
func extraKeys(extra []byte, lora, own string, first bool) (salt string, other bool) {
	tagged := ""
	if own != "" {
		tagged = dynamoSaltTag + own
	}
	r := &reader{b: extra}
	if r.isMap() {
		n, err := r.mapLen()
		return "", err != nil || n > 0
	}
	n, err := r.arrayLen()
	if err != nil {
		return "", true
	}
	for i := range n {
		if r.isNil() {
			continue
		}
		m, err := r.arrayLen()
		if err != nil {
			return "", true
		}
		adapter := false // this entry's LoRA key was seen
		for range m {
			class, v, err := extraKey(r)
			switch {
			case err != nil:
				return "", true
			case class&keySalt != 0 && tagged != "" && string(v) == tagged:
				// SGLang's tagged copy of the salt it sends apart.
			case class&keyLoRA != 0 && !adapter && lora != "" && string(v) == lora:
				adapter = true
			case class&keySalt != 0 && i == 0 && first && salt == "" && len(v) > 0:
				salt = string(v)
			default:
				other = true
			}
		}
	}
	if other {
		salt = ""
	}
	return salt, other
}

// dynamoSaltTag starts the cache salts Dynamo hands vLLM, and SGLang's
// tagged copy of its own in extra_keys (DYNAMO_CACHE_SALT_PREFIX in
// ai-dynamo/dynamo lib/kv-router/src/zmq_wire/extra_keys.rs). A salt
// alone in extra_keys is taken as it is, tag and all: it is the one the
// engine was handed, and so the one the router hashes prompts with.
const dynamoSaltTag = "dynamo-cache-salt:"

// Classes of extra keys, for extraKey.
const (
	keyLoRA = 1 << iota // a LoRA name
	keySalt             // a cache salt
)

// extraKey reads one key of an extra_keys entry and returns what it may
// be (keyLoRA, keySalt, both for a bare string, none for any other key)
// and its string.
func extraKey(r *reader) (class int, v []byte, err error) {
	c, err := r.peek()
	if err != nil {
		return 0, nil, err
	}
	switch {
	case isStr(c):
		v, err = r.raw()
		return keyLoRA | keySalt, v, err
	case !r.isMap():
		return 0, nil, r.skip(1)
	}
	n, err := r.mapLen()
	if err != nil {
		return 0, nil, err
	}
	var typ, name, salt []byte
	for range n {
		k, err := r.raw()
		if err != nil {
			return 0, nil, err
		}
		var p *[]byte
		switch string(k) {
		case "type":
			p = &typ
		case "name":
			p = &name
		case "salt":
			p = &salt
		default:
			if err := r.skip(1); err != nil {
				return 0, nil, err
			}
			continue
		}
		if *p, err = r.raw(); err != nil {
			return 0, nil, err
		}
	}
	switch string(typ) {
	case "lora":
		return keyLoRA, name, nil
	case "cache_salt":
		return keySalt, salt, nil
	}
	return 0, nil, nil
}

// intern returns p as a string, without allocating for the values vLLM
// and SGLang send on nearly every event: their media and KV-cache group
// types.
func intern(p []byte) string {
	switch string(p) {
	case "GPU":
		return "GPU"
	case "full_attention":
		return "full_attention"
	case "mla_attention":
		return "mla_attention"
	case "sliding_window":
		return "sliding_window"
	case "mamba":
		return "mamba"
	}
	return string(p)
}

// isStr reports whether c starts a MessagePack string.
func isStr(c byte) bool {
	return c >= 0xa0 && c <= 0xbf || c == mpStr8 || c == mpStr16 || c == mpStr32
}

// cacheSalt reads a cache_salt field, SGLang's: a string, nil or "" for
// none. A value of another type is a key the event cannot be indexed
// under.
func cacheSalt(r *reader, e *Event) error {
	if r.isNil() {
		return nil
	}
	c, err := r.peek()
	if err != nil {
		return err
	}
	if !isStr(c) {
		e.Salted = true
		return r.skip(1)
	}
	p, err := r.raw()
	if err == nil && len(p) > 0 {
		e.CacheSalt = string(p)
	}
	return err
}

// metadata reads SGLang's BlockStored metadata (BlockStoredMetadata in
// python/sglang/srt/disaggregation/kv_events.py): a map holding the
// request's cache_salt, and session_id, which no hash mixes in. Any other
// key may be hashed, and makes the event Salted.
func metadata(r *reader, e *Event) error {
	if r.isNil() {
		return nil
	}
	if !r.isMap() {
		e.Salted = true
		return r.skip(1)
	}
	n, err := r.mapLen()
	if err != nil {
		return err
	}
	for range n {
		k, err := r.raw()
		if err != nil {
			return fmt.Errorf("metadata key: %w", err)
		}
		switch string(k) {
		case "cache_salt":
			err = cacheSalt(r, e)
		case "session_id":
			err = r.skip(1)
		default:
			e.Salted = true
			err = r.skip(1)
		}
		if err != nil {
			return fmt.Errorf("metadata %q: %w", k, err)
		}
	}
	return nil
}

// AppendBatch appends the MessagePack encoding of b to dst and returns the
// extended slice. The encoding is vLLM's positional one, which every
// consumer of vLLM's and SGLang's streams decodes: the batch as [ts,
// events, data_parallel_rank] (the rank only when it is one DecodeBatch
// accepts, from 0 to 2^31-1), a Stored
// event as ["BlockStored", block_hashes, parent_block_hash, token_ids,
// block_size, lora_id, medium] followed, as far as needed, by lora_name,
// extra_keys (the CacheSalt of an event without a parent, as vLLM sends
// it: in the first block's keys, after the LoRA name), group_idx and
// kv_cache_spec_kind (GroupKind), a Removed event as ["BlockRemoved",
// block_hashes, medium] followed by group_idx when Group is set, and a
// Cleared event as ["AllBlocksCleared"]. Block hashes are written as
// unsigned integers; lora_id is always nil, the adapter going by name.
// Events of an unknown Kind are left out, and Salted is not written.
func AppendBatch(dst []byte, b *Batch) []byte {
	buf := bytes.NewBuffer(dst)
	enc := msgpack.GetEncoder()
	defer msgpack.PutEncoder(enc)
	enc.Reset(buf)
	// Writes to a bytes.Buffer do not fail.
	n := 0
	for i := range b.Events {
		if k := b.Events[i].Kind; k >= Stored && k <= Cleared {
			n++
		}
	}
	rank := b.DPRank >= 0 && b.DPRank <= maxDPRank
	fields := 2
	if rank {
		fields = 3
	}
	_ = enc.EncodeArrayLen(fields)
	_ = enc.EncodeFloat64(b.TS)
	_ = enc.EncodeArrayLen(n)
	for i := range b.Events {
		encodeEvent(enc, &b.Events[i])
	}
	if rank {
		_ = enc.EncodeInt(int64(b.DPRank))
	}
	return buf.Bytes()
}

// encodeExtraKeys writes the extra_keys of a Stored event e: nil, or, when
// salt is set, one entry per block (at least one) as vLLM's
// generate_block_hash_extra_keys makes them: the LoRA name in each block's
// keys, the cache salt after it in the first block's.
func encodeExtraKeys(enc *msgpack.Encoder, e *Event, salt bool) {
	if !salt {
		_ = enc.EncodeNil()
		return
	}
	_ = enc.EncodeArrayLen(max(1, len(e.BlockHashes)))
	for i := range max(1, len(e.BlockHashes)) {
		n := 0
		if e.LoRA != "" {
			n++
		}
		if i == 0 {
			n++
		}
		if n == 0 {
			_ = enc.EncodeNil()
			continue
		}
		_ = enc.EncodeArrayLen(n)
		if e.LoRA != "" {
			_ = enc.EncodeString(e.LoRA)
		}
		if i == 0 {
			_ = enc.EncodeString(e.CacheSalt)
		}
	}
}

func encodeEvent(enc *msgpack.Encoder, e *Event) {
	optString := func(s string) {
		if s == "" {
			_ = enc.EncodeNil()
		} else {
			_ = enc.EncodeString(s)
		}
	}
	hashes := func() {
		_ = enc.EncodeArrayLen(len(e.BlockHashes))
		for _, h := range e.BlockHashes {
			_ = enc.EncodeUint(h)
		}
	}
	switch e.Kind {
	case Stored:
		n := 7
		salt := e.CacheSalt != "" && !e.HasParent
		switch {
		case e.GroupKind != "":
			n = 11
		case e.Group != 0:
			n = 10
		case salt:
			n = 9
		case e.LoRA != "":
			n = 8
		}
		_ = enc.EncodeArrayLen(n)
		_ = enc.EncodeString("BlockStored")
		hashes()
		if e.HasParent {
			_ = enc.EncodeUint(e.Parent)
		} else {
			_ = enc.EncodeNil()
		}
		_ = enc.EncodeArrayLen(len(e.TokenIDs))
		for _, t := range e.TokenIDs {
			_ = enc.EncodeUint(uint64(t))
		}
		_ = enc.EncodeInt(int64(e.BlockSize))
		_ = enc.EncodeNil() // lora_id
		optString(e.Medium)
		if n > 7 {
			optString(e.LoRA)
		}
		if n > 8 {
			encodeExtraKeys(enc, e, salt)
		}
		if n > 9 {
			_ = enc.EncodeInt(int64(e.Group))
		}
		if n > 10 {
			_ = enc.EncodeString(e.GroupKind)
		}
	case Removed:
		if e.Group != 0 {
			_ = enc.EncodeArrayLen(4)
		} else {
			_ = enc.EncodeArrayLen(3)
		}
		_ = enc.EncodeString("BlockRemoved")
		hashes()
		optString(e.Medium)
		if e.Group != 0 {
			_ = enc.EncodeInt(int64(e.Group))
		}
	case Cleared:
		_ = enc.EncodeArrayLen(1)
		_ = enc.EncodeString("AllBlocksCleared")
	}
}
