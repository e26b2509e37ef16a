package httplb

import (
	"encoding/binary"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmlb/llmlb/prefix"
)

// fourBytes is a tokenizer of one token per 4 bytes, as the emulated engines
// count.
func fourBytes(text string) []uint32 {
	var out []uint32
	for len(text) > 0 {
		var b [4]byte
		n := copy(b[:], text)
		out = append(out, binary.LittleEndian.Uint32(b[:]))
		text = text[n:]
	}
	return out
}

// With Tokenize, prompts are hashed in token mode, as the engines' KV events
// report them, and counted in the tokenizer's tokens.
func TestParseTokenize(t *testing.T) {
	h, err := prefix.NewHasher(prefix.HasherConfig{MaxTokens: 32}) // two blocks of 16 tokens
	require.NoError(t, err)
	p, err := NewParser(ParserConfig{Tokenize: fourBytes, Hasher: h})
	require.NoError(t, err)
	long := strings.Repeat("The quick brown fox jumps over the lazy dog. ", 4) // 44 tokens
	salt := prefix.Salt{Model: "m"}
	cases := []struct {
		name, body, text string
	}{
		{"completion", `{"model":"m","prompt":"` + long + `"}`, long},
		{"chat", `{"model":"m","messages":[{"role":"user","content":"` + long + `"}]}`, "user\n" + long + "\n"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			req, err := p.Parse(post(c.body))
			require.NoError(t, err)
			toks := fourBytes(c.text)
			assert.Equal(t, len(toks), req.PromptTokens)
			require.Greater(t, len(toks), 32)
			assert.Equal(t, h.HashTokens(salt, toks[:32]), req.Prefix, "token-mode hashes of the hashed head")
			assert.NotEqual(t, h.HashString(salt, c.text), req.Prefix, "not byte mode")
		})
	}
	_, err = NewParser(ParserConfig{Tokenize: fourBytes, CountTokens: func(string) int { return 1 }})
	assert.ErrorIs(t, err, ErrInvalidConfig)
}
