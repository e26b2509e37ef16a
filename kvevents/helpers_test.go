package kvevents

import (
	"context"
	"fmt"
	"net"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmlb/llmlb/prefix"
)

// testBlock is the block size of the tests, in tokens.
const testBlock = 4

// engineHash is the hash a test engine gives the block whose router hash is
// h: any bijection will do.
func engineHash(h uint64) uint64 { return h ^ 0x5bd1e9955bd1e995 }

// prompt returns n blocks of tokens starting at token base.
func prompt(base uint32, n int) []uint32 {
	t := make([]uint32, n*testBlock)
	for i := range t {
		t[i] = base + uint32(i)
	}
	return t
}

// stored returns the Stored event of blocks [from, to) of tokens, whose
// router hashes are hashes, the way vLLM reports a prefill that found
// blocks [0, from) cached.
func stored(hashes []uint64, tokens []uint32, from, to int) Event {
	e := Event{Kind: Stored, BlockSize: testBlock, Medium: "GPU", TokenIDs: tokens[from*testBlock : to*testBlock]}
	for _, h := range hashes[from:to] {
		e.BlockHashes = append(e.BlockHashes, engineHash(h))
	}
	if from > 0 {
		e.Parent, e.HasParent = engineHash(hashes[from-1]), true
	}
	return e
}

// removed returns the Removed event of the given router hashes.
func removed(hashes ...uint64) Event {
	e := Event{Kind: Removed, Medium: "GPU"}
	for _, h := range hashes {
		e.BlockHashes = append(e.BlockHashes, engineHash(h))
	}
	return e
}

func newTestIndex(t testing.TB) (*prefix.Index, *prefix.Hasher) {
	t.Helper()
	h, err := prefix.NewHasher(prefix.HasherConfig{BlockTokens: testBlock})
	require.NoError(t, err)
	idx, err := prefix.NewIndex(prefix.IndexConfig{BlockSize: testBlock, EventsOnly: true})
	require.NoError(t, err)
	return idx, h
}

// freeAddr returns a loopback TCP address that was free a moment ago.
func freeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return fmt.Sprintf("tcp://%s", l.Addr())
}

// publisherStarter returns a function that starts a Publisher of topic
// "kv-events" on pubAddr and replayAddr, running under ctx and tracked by
// wg, and returns it with a function that stops it and waits for it.
func publisherStarter(ctx context.Context, t testing.TB, wg *sync.WaitGroup, pubAddr, replayAddr string) func() (*Publisher, context.CancelFunc) {
	return func() (*Publisher, context.CancelFunc) {
		p, err := NewPublisher(PublisherConfig{Endpoint: pubAddr, ReplayEndpoint: replayAddr, Topic: "kv-events"})
		require.NoError(t, err)
		pctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		wg.Go(func() { defer close(done); _ = p.Run(pctx) })
		return p, func() { cancel(); <-done }
	}
}
