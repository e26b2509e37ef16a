package prefix

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

func mustHasher(t testing.TB, c HasherConfig) *Hasher {
	t.Helper()
	h, err := NewHasher(c)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func seq(n int, start uint32) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = start + uint32(i)*7919
	}
	return out
}

func TestNewHasherDefaultsAndValidation(t *testing.T) {
	h := mustHasher(t, HasherConfig{})
	if h.BlockTokens() != DefaultBlockTokens || h.BlockBytes() != DefaultBlockBytes || h.MaxBlocks() != DefaultMaxTokens/DefaultBlockTokens {
		t.Fatalf("defaults: tokens %d bytes %d maxBlocks %d", h.BlockTokens(), h.BlockBytes(), h.MaxBlocks())
	}
	cases := []struct {
		name string
		c    HasherConfig
	}{
		{"negative block tokens", HasherConfig{BlockTokens: -1}},
		{"huge block tokens", HasherConfig{BlockTokens: maxBlockTokens + 1}},
		{"negative block bytes", HasherConfig{BlockBytes: -64}},
		{"huge block bytes", HasherConfig{BlockBytes: maxBlockBytes + 1}},
		{"max tokens below block", HasherConfig{BlockTokens: 32, MaxTokens: 16}},
		{"negative max tokens", HasherConfig{MaxTokens: -1}},
		{"huge max tokens", HasherConfig{MaxTokens: maxMaxTokens + 1}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := NewHasher(tc.c); !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("NewHasher(%+v) error %v, want ErrInvalidConfig", tc.c, err)
			}
		})
	}
}

func TestHashTokensChain(t *testing.T) {
	h := mustHasher(t, HasherConfig{})
	s := Salt{Model: "llama"}
	a := seq(100, 1) // 6 full blocks and 4 tokens
	got := h.HashTokens(s, a)
	if len(got) != 6 {
		t.Fatalf("100 tokens in blocks of 16: %d hashes, want 6 (only full blocks)", len(got))
	}
	if !slices.Equal(h.HashTokens(s, a[:96]), got) {
		t.Fatal("a trailing partial block changed the hashes")
	}
	if !slices.Equal(h.HashTokens(s, a[:40]), got[:2]) {
		t.Fatal("a shorter prompt does not give the leading hashes")
	}
	if h.HashTokens(s, a[:15]) != nil {
		t.Fatal("less than a block hashed to something")
	}
	// Diverge in block 3: hashes 0..2 equal, 3.. differ.
	b := slices.Clone(a)
	b[3*16+5]++
	checkDivergence(t, got, h.HashTokens(s, b), 3)
	// Distinct hashes within a chain even for repeated content.
	rep := make([]uint32, 64)
	r := h.HashTokens(s, rep)
	if len(r) != 4 || r[0] == r[1] || r[1] == r[2] || r[2] == r[3] {
		t.Fatalf("repeated blocks must chain to distinct hashes: %x", r)
	}
}

func TestHashCap(t *testing.T) {
	h := mustHasher(t, HasherConfig{BlockTokens: 16, BlockBytes: 8, MaxTokens: 70})
	if h.MaxBlocks() != 4 {
		t.Fatalf("MaxBlocks = %d, want 4", h.MaxBlocks())
	}
	if n := len(h.HashTokens(Salt{}, seq(1000, 3))); n != 4 {
		t.Fatalf("token hashes = %d, want cap 4", n)
	}
	if n := len(h.HashString(Salt{}, string(make([]byte, 1000)))); n != 4 {
		t.Fatalf("byte hashes = %d, want cap 4", n)
	}
	def := mustHasher(t, HasherConfig{})
	if n := len(def.HashTokens(Salt{}, seq(200_000, 1))); n != DefaultMaxTokens/16 {
		t.Fatalf("default cap: %d hashes, want %d", n, DefaultMaxTokens/16)
	}
}

func TestSaltChangesEverything(t *testing.T) {
	h := mustHasher(t, HasherConfig{})
	tokens := seq(64, 5)
	base := Salt{Model: "m", Adapter: "a", Namespace: "n", ReasoningEffort: "low", Tenant: "t"}
	want := h.HashTokens(base, tokens)
	variants := []Salt{
		{Model: "m2", Adapter: "a", Namespace: "n", ReasoningEffort: "low", Tenant: "t"},
		{Model: "m", Adapter: "a2", Namespace: "n", ReasoningEffort: "low", Tenant: "t"},
		{Model: "m", Adapter: "a", Namespace: "n2", ReasoningEffort: "low", Tenant: "t"},
		{Model: "m", Adapter: "a", Namespace: "n", ReasoningEffort: "high", Tenant: "t"},
		{Model: "m", Adapter: "a", Namespace: "n", ReasoningEffort: "low", Tenant: "t2"},
		// Field boundaries are unambiguous.
		{Model: "ma", Adapter: "", Namespace: "n", ReasoningEffort: "low", Tenant: "t"},
		{Model: "m", Adapter: "an", Namespace: "", ReasoningEffort: "low", Tenant: "t"},
	}
	for _, v := range variants {
		checkDivergence(t, want, h.HashTokens(v, tokens), 0)
	}
	// Block sizes are part of the root: a hasher with another byte block
	// size never produces the same token chain.
	other := mustHasher(t, HasherConfig{BlockBytes: 32})
	checkDivergence(t, want, other.HashTokens(base, tokens), 0)
}

func TestTenantIsolation(t *testing.T) {
	tokens := seq(64, 9)
	a, b := Salt{Model: "m", Tenant: "alice"}, Salt{Model: "m", Tenant: "bob"}
	iso := mustHasher(t, HasherConfig{})
	if iso.Root(a) == iso.Root(b) {
		t.Fatal("isolation on: tenants share a root")
	}
	checkDivergence(t, iso.HashTokens(a, tokens), iso.HashTokens(b, tokens), 0)
	if iso.Root(Salt{Model: "m"}) == iso.Root(a) {
		t.Fatal("isolation on: the empty tenant shares a root with a named one")
	}
	shared := mustHasher(t, HasherConfig{ShareAcrossTenants: true})
	if !slices.Equal(shared.HashTokens(a, tokens), shared.HashTokens(b, tokens)) {
		t.Fatal("ShareAcrossTenants: tenants do not share hashes")
	}
	if shared.Root(a) == iso.Root(a) {
		t.Fatal("shared and isolated roots coincide")
	}
}

func TestByteMode(t *testing.T) {
	h := mustHasher(t, HasherConfig{BlockBytes: 4})
	s := Salt{Model: "m"}
	text := "abcdefghij"
	got := h.HashString(s, text)
	if len(got) != 2 {
		t.Fatalf("10 bytes in blocks of 4: %d hashes, want 2", len(got))
	}
	if !slices.Equal(h.AppendBytes(nil, h.Root(s), []byte(text)), got) {
		t.Fatal("AppendBytes != AppendString")
	}
	checkDivergence(t, got, h.HashString(s, "abcdXfghij"), 1)
	// A token chain and a byte chain over the same memory never share a
	// hash: tokens 0x64636261 ("abcd") with BlockTokens 1 vs bytes with
	// BlockBytes 4.
	tk := mustHasher(t, HasherConfig{BlockTokens: 1, BlockBytes: 4})
	tok := tk.HashTokens(s, []uint32{0x64636261})
	byt := tk.HashString(s, "abcd")
	if len(tok) != 1 || len(byt) != 1 || tok[0] == byt[0] {
		t.Fatalf("token and byte chains collide: %x %x", tok, byt)
	}
}

// TestHashStable pins the hash of a fixed input so that an accidental
// change of the encoding (which would silently stop all matches against
// hashes stored elsewhere) fails a test.
func TestHashStable(t *testing.T) {
	h := mustHasher(t, HasherConfig{})
	s := Salt{Model: "m", Tenant: "t"}
	tok := h.HashTokens(s, seq(32, 1))
	byt := h.HashString(s, strings.Repeat("The quick brown fox jumps over the lazy dog, then naps in the sun.", 2))
	want := []uint64{0xa61a809cac5cda77, 0xfa85b7cc13e18d56, 0xc2a912c1fc12ce07, 0x8325800a0eb9510}
	got := []uint64{tok[0], tok[1], byt[0], byt[1]}
	if !slices.Equal(got, want) {
		t.Fatalf("hashes changed: got %#x, want %#x", got, want)
	}
}

// TestPortableTokenEncoding checks that the portable path (encode each
// token, stream through a digest) hashes exactly like the in-place path, for
// small blocks and for blocks larger than the encoding buffer.
func TestPortableTokenEncoding(t *testing.T) {
	if !littleEndian {
		t.Skip("big-endian machine: no in-place path to compare")
	}
	for _, bt := range []int{1, 16, 100} {
		tokens := seq(5*bt, 11)
		native := appendTokensInPlace(nil, 42, tokens, bt)
		portable := appendTokensEncoded(nil, 42, tokens, bt)
		if len(native) != 5 || !slices.Equal(native, portable) {
			t.Fatalf("BlockTokens %d: portable encoding differs (%d vs %d hashes)", bt, len(native), len(portable))
		}
	}
}

func TestHashAllocs(t *testing.T) {
	h := mustHasher(t, HasherConfig{})
	tokens := seq(4096, 1)
	text := string(make([]byte, 4096))
	root := h.Root(Salt{Model: "m", Tenant: "t"})
	dst := make([]uint64, 0, 256)
	if n := testing.AllocsPerRun(100, func() {
		dst = h.AppendTokens(dst[:0], root, tokens)
		dst = h.AppendString(dst[:0], root, text)
		root = h.Root(Salt{Model: "m", Tenant: "t"})
	}); n != 0 {
		t.Fatalf("Append with room and Root: %v allocs, want 0", n)
	}
	if got := h.AppendTokens([]uint64{42}, root, tokens[:32]); len(got) != 3 || got[0] != 42 {
		t.Fatalf("AppendTokens did not append: %v", got)
	}
}

// TestChainContinuation checks that hashing the blocks after block k from
// h_k gives the rest of the chain, in both modes: the property engine-event
// translation relies on.
func TestChainContinuation(t *testing.T) {
	h := mustHasher(t, HasherConfig{BlockTokens: 4, BlockBytes: 3})
	root := h.Root(Salt{Model: "m"})
	tokens := seq(40, 2)
	full := h.AppendTokens(nil, root, tokens)
	text := "abcdefghijklmnopqrstuvwxyz0123"
	fullB := h.AppendString(nil, root, text)
	for k := 1; k < len(full); k++ {
		if got := h.AppendTokens(nil, full[k-1], tokens[4*k:]); !slices.Equal(got, full[k:]) {
			t.Fatalf("token chain continued after block %d differs", k)
		}
	}
	for k := 1; k < len(fullB); k++ {
		if got := h.AppendString(nil, fullB[k-1], text[3*k:]); !slices.Equal(got, fullB[k:]) {
			t.Fatalf("byte chain continued after block %d differs", k)
		}
	}
}
