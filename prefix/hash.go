package prefix

import (
	"encoding/binary"
	"fmt"
	"unsafe"

	"github.com/cespare/xxhash/v2"
)

// Defaults of [HasherConfig].
const (
	// DefaultBlockTokens is the default number of tokens per block, vLLM's
	// default KV block size.
	DefaultBlockTokens = 16
	// DefaultBlockBytes is the default number of prompt bytes per block in
	// byte mode: about 16 tokens of English text at about 4 bytes a token.
	DefaultBlockBytes = 64
	// DefaultMaxTokens is the default cap on the hashed prompt head, in
	// tokens (128k, the cap llm-d adopted for long agent sessions).
	DefaultMaxTokens = 128 << 10
)

// Limits of [HasherConfig]; larger values are rejected.
const (
	maxBlockTokens = 1 << 16
	maxBlockBytes  = 1 << 20
	maxMaxTokens   = 1 << 26
)

// HasherConfig configures a [Hasher]. The zero value is valid and selects
// every default.
type HasherConfig struct {
	// BlockTokens is the number of tokens per block in token mode. It must
	// equal the engine's KV block size when the hashes are matched against
	// engine KV events. Zero means [DefaultBlockTokens].
	BlockTokens int
	// BlockBytes is the number of prompt bytes per block in byte mode, for
	// routers that do not tokenize. Zero means [DefaultBlockBytes].
	BlockBytes int
	// MaxTokens caps the hashed prompt head: only the first
	// MaxTokens/BlockTokens blocks are hashed. Byte mode hashes at most the
	// same number of blocks (MaxTokens/BlockTokens blocks of BlockBytes
	// bytes: 512 KiB of text with the defaults). Zero means
	// [DefaultMaxTokens]; it must be at least BlockTokens.
	MaxTokens int
	// ShareAcrossTenants turns tenant isolation off: the Tenant field of a
	// [Salt] is then ignored, and identical prompts of different tenants
	// hash identically and share cache affinity. Isolation is on by
	// default because a prefix-cache hit is observable as a shorter time to
	// first token, which leaks whether another tenant sent the same prompt.
	ShareAcrossTenants bool
}

// Salt holds the request attributes that select a separate prefix cache.
// Two prompts match only if their salts are equal (Tenant is ignored when
// [HasherConfig.ShareAcrossTenants] is set). Empty fields are valid values.
type Salt struct {
	// Model is the model name; different models never share KV blocks.
	Model string
	// Adapter is the LoRA adapter, if any.
	Adapter string
	// Namespace is a cache namespace (for example vLLM's cache_salt).
	Namespace string
	// ReasoningEffort is the reasoning-effort setting when it changes the
	// rendered prompt.
	ReasoningEffort string
	// Tenant is the isolation principal.
	Tenant string
}

// Hasher turns a prompt into chained block hashes:
//
//	h_0 = Root(salt)
//	h_i = mix(h_{i-1}, XXH64(content of block i))    for i = 1..n
//
// where only full blocks are hashed, at most MaxTokens/BlockTokens of them. In
// token mode the content of a block is its BlockTokens tokens as 4-byte
// little-endian integers; in byte mode it is BlockBytes bytes of the prompt
// text, and h_{i-1} is first XORed with a constant so that token and byte
// chains never share a hash. mix multiplies h_{i-1} by an odd constant, XORs
// in the block's hash and applies XXH64's final avalanche, a bijection, so
// distinct parents give distinct children; blocks are hashed in place,
// without copying. The result is h_1..h_n: equal prompt heads under equal
// salts give equal leading hashes, and the hashes differ from the first
// differing block on.
//
// Because each step depends only on the previous hash, a chain can be
// continued: passing h_k as the root of the Append methods hashes the blocks
// that follow block k. That is how engine KV events, which report new blocks
// with their parent, are translated into the router's hashes (see
// [Index.Stored]). The cap of MaxBlocks hashes applies to each call, counted
// from the root it is given, so a continued chain may reach past the blocks
// a prompt hashed whole gives; the hashes beyond them match nothing.
//
// A Hasher is immutable and safe for concurrent use. The Append methods do
// not allocate when dst has room. The zero Hasher is not usable; create one
// with [NewHasher].
type Hasher struct {
	blockTokens int
	blockBytes  int
	maxBlocks   int
	share       bool
}

// NewHasher returns a Hasher for c, or an error wrapping [ErrInvalidConfig]
// if a field is out of range.
func NewHasher(c HasherConfig) (*Hasher, error) {
	if c.BlockTokens == 0 {
		c.BlockTokens = DefaultBlockTokens
	}
	if c.BlockBytes == 0 {
		c.BlockBytes = DefaultBlockBytes
	}
	if c.MaxTokens == 0 {
		c.MaxTokens = DefaultMaxTokens
	}
	switch {
	case c.BlockTokens < 0 || c.BlockTokens > maxBlockTokens:
		return nil, fmt.Errorf("%w: BlockTokens %d out of range [1, %d]", ErrInvalidConfig, c.BlockTokens, maxBlockTokens)
	case c.BlockBytes < 0 || c.BlockBytes > maxBlockBytes:
		return nil, fmt.Errorf("%w: BlockBytes %d out of range [1, %d]", ErrInvalidConfig, c.BlockBytes, maxBlockBytes)
	case c.MaxTokens < c.BlockTokens || c.MaxTokens > maxMaxTokens:
		return nil, fmt.Errorf("%w: MaxTokens %d out of range [BlockTokens=%d, %d]", ErrInvalidConfig, c.MaxTokens, c.BlockTokens, maxMaxTokens)
	}
	return &Hasher{
		blockTokens: c.BlockTokens,
		blockBytes:  c.BlockBytes,
		maxBlocks:   c.MaxTokens / c.BlockTokens,
		share:       c.ShareAcrossTenants,
	}, nil
}

// BlockTokens returns the number of tokens per block in token mode. An
// [Index] fed with these hashes must be configured with the same block size.
func (h *Hasher) BlockTokens() int { return h.blockTokens }

// BlockBytes returns the number of bytes per block in byte mode.
func (h *Hasher) BlockBytes() int { return h.blockBytes }

// MaxBlocks returns the maximum number of hashes produced for one prompt.
func (h *Hasher) MaxBlocks() int { return h.maxBlocks }

// rootVersion names the encoding of the root; change it whenever the hash
// of any input changes, so that stale hashes never match.
const rootVersion = "llmlb-prefix-v1"

// byteModeSeed is XORed into the previous hash at every step of a byte-mode
// chain, so that token and byte chains never share a hash and a byte chain
// can be continued from any of its hashes like a token chain.
const byteModeSeed = 0x9e3779b97f4a7c15

// Root returns h_0, the root of every chain hashed for s: a hash of the
// block sizes and of each salt field, length-prefixed so that no two
// distinct salts encode alike. The Tenant field is included unless the
// Hasher shares blocks across tenants. Callers hashing many prompts with the
// same salt may compute the root once and reuse it.
func (h *Hasher) Root(s Salt) uint64 {
	var d xxhash.Digest
	d.Reset()
	var buf [2 * binary.MaxVarintLen64]byte
	n := binary.PutUvarint(buf[:], uint64(h.blockTokens))
	n += binary.PutUvarint(buf[n:], uint64(h.blockBytes))
	_, _ = d.WriteString(rootVersion)
	_, _ = d.Write(buf[:n])
	writeField(&d, s.Model)
	writeField(&d, s.Adapter)
	writeField(&d, s.Namespace)
	writeField(&d, s.ReasoningEffort)
	if h.share {
		_, _ = d.Write([]byte{0})
	} else {
		_, _ = d.Write([]byte{1})
		writeField(&d, s.Tenant)
	}
	return d.Sum64()
}

func writeField(d *xxhash.Digest, s string) {
	var buf [binary.MaxVarintLen64]byte
	n := binary.PutUvarint(buf[:], uint64(len(s)))
	_, _ = d.Write(buf[:n])
	_, _ = d.WriteString(s)
}

// chain returns h_i from h_{i-1} and the XXH64 of block i's content. The
// multiplication by an odd constant and the XOR are bijective in prev, and
// the final avalanche (XXH64's own) is a bijection, so distinct parents
// never collide on the same content.
func chain(prev, content uint64) uint64 {
	x := prev*prime1 ^ content
	x ^= x >> 33
	x *= prime2
	x ^= x >> 29
	x *= prime3
	x ^= x >> 32
	return x
}

// XXH64 primes.
const (
	prime1 uint64 = 11400714785074694791
	prime2 uint64 = 14029467366897019727
	prime3 uint64 = 1609587929392839161
)

// encodeBufLen is the size of the stack buffer tokens are encoded into on
// big-endian machines.
const encodeBufLen = 256

// AppendTokens appends the hashes of the full blocks of tokens, chained from
// root, to dst and returns the extended slice. root is [Hasher.Root] of the
// request's salt, or the last hash of a prefix to continue its chain.
func (h *Hasher) AppendTokens(dst []uint64, root uint64, tokens []uint32) []uint64 {
	bt := h.blockTokens
	n := min(len(tokens)/bt, h.maxBlocks)
	if n == 0 {
		return dst
	}
	dst = grow(dst, n)
	if littleEndian {
		return appendTokensInPlace(dst, root, tokens[:n*bt], bt)
	}
	return appendTokensEncoded(dst, root, tokens[:n*bt], bt)
}

// appendTokensInPlace hashes the blocks of tokens (a whole number of blocks
// of bt tokens) on a little-endian machine, where the memory of tokens is
// already their little-endian encoding.
func appendTokensInPlace(dst []uint64, prev uint64, tokens []uint32, bt int) []uint64 {
	step := 4 * bt
	raw := unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(tokens))), 4*len(tokens))
	for i := 0; i+step <= len(raw); i += step {
		prev = chain(prev, xxhash.Sum64(raw[i:i+step]))
		dst = append(dst, prev)
	}
	return dst
}

// appendTokensEncoded hashes the blocks of tokens (a whole number of blocks
// of bt tokens) on any machine, encoding the tokens little-endian through a
// stack buffer.
func appendTokensEncoded(dst []uint64, prev uint64, tokens []uint32, bt int) []uint64 {
	var d xxhash.Digest
	var buf [encodeBufLen]byte
	for ; len(tokens) >= bt; tokens = tokens[bt:] {
		d.Reset()
		block := tokens[:bt]
		for len(block) > 0 {
			k := min(len(block), len(buf)/4)
			for j, t := range block[:k] {
				binary.LittleEndian.PutUint32(buf[4*j:], t)
			}
			_, _ = d.Write(buf[:4*k])
			block = block[k:]
		}
		prev = chain(prev, d.Sum64())
		dst = append(dst, prev)
	}
	return dst
}

// AppendBytes appends the byte-mode hashes of the full blocks of text,
// chained from root, to dst and returns the extended slice. root is
// [Hasher.Root] of the request's salt, or the last hash of a byte-mode prefix
// to continue its chain.
func (h *Hasher) AppendBytes(dst []uint64, root uint64, text []byte) []uint64 {
	// The string view only lives for the call, which does not modify text.
	return h.AppendString(dst, root, unsafe.String(unsafe.SliceData(text), len(text)))
}

// AppendString is [Hasher.AppendBytes] for a string, without copying it.
func (h *Hasher) AppendString(dst []uint64, root uint64, text string) []uint64 {
	bb := h.blockBytes
	n := min(len(text)/bb, h.maxBlocks)
	if n == 0 {
		return dst
	}
	dst = grow(dst, n)
	prev := root
	for i := 0; i < n; i++ {
		prev = chain(prev^byteModeSeed, xxhash.Sum64String(text[i*bb:(i+1)*bb]))
		dst = append(dst, prev)
	}
	return dst
}

// HashTokens returns the token-mode hashes of tokens under salt s. It is
// shorthand for AppendTokens(nil, h.Root(s), tokens) and allocates the
// result.
func (h *Hasher) HashTokens(s Salt, tokens []uint32) []uint64 {
	return h.AppendTokens(nil, h.Root(s), tokens)
}

// HashString returns the byte-mode hashes of text under salt s. It is
// shorthand for AppendString(nil, h.Root(s), text) and allocates the result.
func (h *Hasher) HashString(s Salt, text string) []uint64 {
	return h.AppendString(nil, h.Root(s), text)
}

// grow makes room for n more elements in dst, allocating at most once.
func grow(dst []uint64, n int) []uint64 {
	if cap(dst)-len(dst) >= n {
		return dst
	}
	out := make([]uint64, len(dst), len(dst)+n)
	copy(out, dst)
	return out
}

// littleEndian reports whether the machine stores integers little-endian, in
// which case the memory of a []uint32 is its own little-endian encoding.
var littleEndian = func() bool {
	x := uint16(1)
	return *(*byte)(unsafe.Pointer(&x)) == 1
}()
