package engine

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmlb/llmlb/kvevents"
	"github.com/llmlb/llmlb/prefix"
)

func TestTokens(t *testing.T) {
	assert.Equal(t, []uint32{0x64636261, 0x65}, Tokens("abcde"))
	assert.Empty(t, Tokens(""))
	assert.Len(t, Tokens(strings.Repeat("x", 64)), 16)
}

// TestKVEventsHook checks the events of one request: its full prompt blocks
// are stored, chained by parent, with the token IDs Tokens gives.
func TestKVEventsHook(t *testing.T) {
	var mu sync.Mutex
	var got []kvevents.Event
	e := newEngine(t, Config{BlockSize: 4, KVEvents: func(b *kvevents.Batch) {
		mu.Lock()
		got = append(got, b.Events...)
		mu.Unlock()
	}})
	url, _ := serve(t, e)
	text := strings.Repeat("0123456789abcdef", 3) + "tail" // 13 tokens: 3 full blocks
	resp, err := client.Post(url+"/v1/completions", "application/json", strings.NewReader(fmt.Sprintf(`{"prompt":%q,"max_tokens":1}`, text)))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(got) > 0 }, 5*time.Second, time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, got, 1)
	ev := got[0]
	assert.Equal(t, kvevents.Stored, ev.Kind)
	assert.False(t, ev.HasParent)
	assert.Len(t, ev.BlockHashes, 3)
	assert.Equal(t, 4, ev.BlockSize)
	assert.Equal(t, "GPU", ev.Medium)
	assert.Equal(t, Tokens(text)[:12], ev.TokenIDs)
}

func freeTCP(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return "tcp://" + l.Addr().String()
}

// TestKVEventsToIndex publishes an engine's events over ZMQ to a
// kvevents.Subscriber: a router that tokenizes with Tokens and hashes with
// the engine's block size finds each prompt where the engine cached it, and
// loses it when the engine evicts it.
func TestKVEventsToIndex(t *testing.T) {
	const block = 4
	pubAddr, replayAddr := freeTCP(t), freeTCP(t)
	pub, err := kvevents.NewPublisher(kvevents.PublisherConfig{Endpoint: pubAddr, ReplayEndpoint: replayAddr, Topic: "kv-events"})
	require.NoError(t, err)
	e := newEngine(t, Config{Speedup: 1000, BlockSize: block, KVBlocks: 64, KVEvents: pub.Publish})

	h, err := prefix.NewHasher(prefix.HasherConfig{BlockTokens: block})
	require.NoError(t, err)
	idx, err := prefix.NewIndex(prefix.IndexConfig{BlockSize: block, EventsOnly: true})
	require.NoError(t, err)
	sub, err := kvevents.NewSubscriber(kvevents.Config{Index: idx, Hasher: h, MinBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond})
	require.NoError(t, err)
	salt := prefix.Salt{Model: e.Model()}
	require.NoError(t, sub.SetEndpoints(map[string]kvevents.Endpoint{"e": {PubAddr: pubAddr, ReplayAddr: replayAddr, Topic: "kv-events", Salt: salt}}))

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = pub.Run(ctx) })
	wg.Go(func() { _ = sub.Run(ctx) })
	defer wg.Wait()
	defer cancel()
	url, _ := serve(t, e)
	require.Eventually(t, func() bool { st, _ := sub.Stats("e"); return st.Connected }, 10*time.Second, 5*time.Millisecond)

	ask := func(text string) {
		resp, err := client.Post(url+"/v1/completions", "application/json", strings.NewReader(fmt.Sprintf(`{"prompt":%q,"max_tokens":1}`, text)))
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
	}
	promptOf := func(i int) string { return strings.Repeat(fmt.Sprintf("prompt %04d ", i), 16) } // 48 tokens, 12 blocks
	first := h.HashTokens(salt, Tokens(promptOf(0)))
	require.Len(t, first, 12)
	// The subscription may take effect after the connection, and a cached
	// prompt publishes nothing when asked again: ask a new short prompt
	// until one shows up, so the subscriber is known to be live.
	warm := 0
	require.Eventually(t, func() bool {
		warm++
		text := fmt.Sprintf("warm up %08d", warm) // 16 bytes: 4 tokens, 1 block
		ask(text)
		return idx.MatchLen("e", h.HashTokens(salt, Tokens(text)), time.Now()) == 1
	}, 10*time.Second, 20*time.Millisecond)
	ask(promptOf(0))
	require.Eventually(t, func() bool {
		return idx.MatchLen("e", first, time.Now()) == len(first)
	}, 10*time.Second, 5*time.Millisecond)

	// Distinct prompts fill the 64-block cache and evict the first.
	for i := 1; i <= 8; i++ {
		ask(promptOf(i))
	}
	last := h.HashTokens(salt, Tokens(promptOf(8)))
	require.Eventually(t, func() bool {
		return idx.MatchLen("e", last, time.Now()) == len(last) && idx.MatchLen("e", first, time.Now()) < len(first)
	}, 10*time.Second, 5*time.Millisecond)
	assert.LessOrEqual(t, idx.Len("e"), 64)
	st, _ := sub.Stats("e")
	assert.Zero(t, st.Malformed)
	assert.Zero(t, st.Skipped)
	assert.Positive(t, st.Removed)
}
