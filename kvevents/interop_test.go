package kvevents

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmlb/llmlb/prefix"
)

// python returns a python3 interpreter with pyzmq and msgpack, the
// libraries vLLM's publisher and its consumers are built on (Debian:
// apt-get install python3-zmq python3-msgpack), or skips the test. The
// first python3 on PATH is tried, then the system's /usr/bin/python3.
func python(t *testing.T) string {
	t.Helper()
	var tried []string
	for _, p := range []string{"python3", "/usr/bin/python3"} {
		path, err := exec.LookPath(p)
		if err != nil {
			continue
		}
		out, err := exec.Command(path, "-c", "import zmq, msgpack").CombinedOutput()
		if err == nil {
			return path
		}
		tried = append(tried, fmt.Sprintf("%s: %v: %s", path, err, bytes.TrimSpace(out)))
	}
	t.Skipf("no python3 with pyzmq and msgpack (apt-get install python3-zmq python3-msgpack); tried %q", tried)
	return ""
}

// freePort returns a loopback TCP port that was free a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// script is a Python test script driven line by line over stdin and stdout.
type script struct {
	t      *testing.T
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan string
	stderr *bytes.Buffer
	wg     sync.WaitGroup
}

func startScript(t *testing.T, ctx context.Context, python string, args ...string) *script {
	t.Helper()
	s := &script{t: t, cmd: exec.CommandContext(ctx, python, args...), lines: make(chan string, 64), stderr: new(bytes.Buffer)}
	s.cmd.Stderr = s.stderr
	var err error
	s.stdin, err = s.cmd.StdinPipe()
	require.NoError(t, err)
	out, err := s.cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, s.cmd.Start())
	s.wg.Go(func() {
		defer close(s.lines)
		sc := bufio.NewScanner(out)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			s.lines <- sc.Text()
		}
	})
	t.Cleanup(s.stop)
	return s
}

// expect waits for the next line and checks it starts with want.
func (s *script) expect(want string) string {
	s.t.Helper()
	select {
	case l, ok := <-s.lines:
		require.True(s.t, ok, "script exited; stderr:\n%s", s.stderr)
		require.True(s.t, strings.HasPrefix(l, want), "got %q, want %q; stderr:\n%s", l, want, s.stderr)
		return l
	case <-time.After(waitFor):
		s.t.Fatalf("no %q from the script after %v; stderr:\n%s", want, waitFor, s.stderr)
		return ""
	}
}

func (s *script) send(line string) {
	s.t.Helper()
	_, err := io.WriteString(s.stdin, line+"\n")
	require.NoError(s.t, err, "stderr:\n%s", s.stderr)
}

func (s *script) stop() {
	_ = s.stdin.Close()
	for range s.lines { // drain until the script exits
	}
	s.wg.Wait()
	_ = s.cmd.Wait()
}

// TestInteropPythonPublisher subscribes to a publisher written with pyzmq
// and msgpack that sends batches the way each vLLM version has: positional
// and map-encoded events, integer (also negative) and byte-string block
// hashes, fields added over versions and unknown ones. The index ends up
// holding exactly the blocks the engine holds, under the router's hashes; a
// batch lost on the live stream is replayed, an engine restart and a gap the
// replay cannot fill clear the endpoint.
func TestInteropPythonPublisher(t *testing.T) {
	python := python(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pubPort, replayPort := freePort(t), freePort(t)
	py := startScript(t, ctx, python, "testdata/vllm_publisher.py", strconv.Itoa(pubPort), strconv.Itoa(replayPort), "kv-events", strconv.Itoa(testBlock))
	py.expect("ready")
	step := func(name string) { py.send(name); py.expect("done " + name) }

	idx, h := newTestIndex(t)
	salt := prefix.Salt{Model: "m"}
	sub, err := NewSubscriber(Config{Index: idx, Hasher: h, MinBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond})
	require.NoError(t, err)
	require.NoError(t, sub.SetEndpoints(map[string]Endpoint{"vllm": {
		PubAddr:    fmt.Sprintf("tcp://127.0.0.1:%d", pubPort),
		ReplayAddr: fmt.Sprintf("tcp://127.0.0.1:%d", replayPort),
		Topic:      "kv-events",
		Salt:       salt,
	}}))
	var wg sync.WaitGroup
	subCtx, stopSub := context.WithCancel(ctx)
	wg.Go(func() { _ = sub.Run(subCtx) })
	defer wg.Wait()
	defer stopSub()
	stats := func() Stats { s, _ := sub.Stats("vllm"); return s }
	require.Eventually(t, func() bool { step("warm"); return stats().Batches > 0 }, waitFor, 20*time.Millisecond)

	hashes := func(s prefix.Salt, base uint32, blocks int) []uint64 {
		return h.HashTokens(s, prompt(base, blocks))
	}
	a, b, c := hashes(salt, 1000, 3), hashes(salt, 2000, 3), hashes(salt, 3000, 2)
	n, q, s := hashes(salt, 4000, 2), hashes(salt, 5000, 2), hashes(salt, 7000, 2)
	lora := hashes(prefix.Salt{Model: "m", Adapter: "ad1"}, 6000, 2)
	d, e := hashes(salt, 8000, 2), hashes(salt, 9000, 1)
	match := func(blocks []uint64) int { return idx.MatchLen("vllm", blocks, time.Now()) }
	waitMatch := func(what string, want map[string]int, sets map[string][]uint64) {
		t.Helper()
		ok := assert.Eventually(t, func() bool {
			for k, v := range want {
				if match(sets[k]) != v {
					return false
				}
			}
			return true
		}, waitFor, tick, what)
		if !ok {
			for k, v := range want {
				t.Logf("%s: %s matches %d blocks, want %d", what, k, match(sets[k]), v)
			}
			t.Logf("stats %+v; script stderr:\n%s", stats(), py.stderr)
			t.FailNow()
		}
	}
	sets := map[string][]uint64{"a": a, "b": b, "c": c, "n": n, "q": q, "s": s, "lora": lora, "d": d, "e": e}

	step("store")
	waitMatch("store", map[string]int{"a": 3, "b": 3, "n": 2, "lora": 2, "q": 0, "s": 0}, sets)
	before := stats()
	assert.Equal(t, int64(0), before.Malformed)

	step("gap")
	waitMatch("gap", map[string]int{"a": 2, "b": 1, "c": 2}, sets)
	st := stats()
	assert.Equal(t, before.Gaps+1, st.Gaps)
	assert.Equal(t, before.Replayed+1, st.Replayed)
	assert.Equal(t, before.Resets, st.Resets)

	step("restart")
	waitMatch("restart", map[string]int{"a": 0, "b": 0, "c": 0, "n": 0, "lora": 0, "d": 2}, sets)
	assert.Greater(t, stats().Resets, st.Resets)

	step("lost")
	waitMatch("lost", map[string]int{"d": 0, "e": 1}, sets)

	step("cleared")
	waitMatch("cleared", map[string]int{"e": 0}, sets)
	assert.Equal(t, int64(0), stats().Malformed)
	py.send("quit")
}

// TestInteropSGLangEpoch subscribes to a pyzmq publisher whose live
// messages carry SGLang's epoch after the topic: libzmq's PUB socket
// matches the subscription as a prefix, so they arrive and are indexed,
// and an engine restart whose sequence numbers follow on, seen only by
// its new epoch, clears the endpoint's blocks, once.
func TestInteropSGLangEpoch(t *testing.T) {
	python := python(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pubPort, replayPort := freePort(t), freePort(t)
	py := startScript(t, ctx, python, "testdata/vllm_publisher.py", strconv.Itoa(pubPort), strconv.Itoa(replayPort), "kv-events", strconv.Itoa(testBlock), "epoch")
	py.expect("ready")
	step := func(name string) { py.send(name); py.expect("done " + name) }

	idx, h := newTestIndex(t)
	salt := prefix.Salt{Model: "m"}
	sub, err := NewSubscriber(Config{Index: idx, Hasher: h, MinBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond})
	require.NoError(t, err)
	require.NoError(t, sub.SetEndpoints(map[string]Endpoint{"sglang": {
		PubAddr:    fmt.Sprintf("tcp://127.0.0.1:%d", pubPort),
		ReplayAddr: fmt.Sprintf("tcp://127.0.0.1:%d", replayPort),
		Topic:      "kv-events",
		Salt:       salt,
	}}))
	var wg sync.WaitGroup
	subCtx, stopSub := context.WithCancel(ctx)
	wg.Go(func() { _ = sub.Run(subCtx) })
	defer wg.Wait()
	defer stopSub()
	stats := func() Stats { s, _ := sub.Stats("sglang"); return s }
	require.Eventually(t, func() bool { step("warm"); return stats().Batches > 0 }, waitFor, 20*time.Millisecond)

	a := h.HashTokens(salt, prompt(1000, 3))
	d := h.HashTokens(salt, prompt(8000, 2))
	match := func(hs []uint64) int { return idx.MatchLen("sglang", hs, time.Now()) }
	step("store")
	require.Eventually(t, func() bool { return match(a) == 3 }, waitFor, tick, "stats %+v; stderr:\n%s", stats(), py.stderr)
	before := stats()

	step("epoch_restart")
	require.Eventually(t, func() bool { return match(d) == 2 }, waitFor, tick, "stats %+v; stderr:\n%s", stats(), py.stderr)
	assert.Equal(t, 0, match(a), "the blocks of the engine's previous process are still indexed")
	st := stats()
	assert.Equal(t, before.Resets+1, st.Resets)
	assert.Equal(t, int64(0), st.Malformed)
	py.send("quit")
}

// TestInteropNewestVLLM subscribes to a pyzmq and msgpack publisher that
// sends events as vLLM's 2026 kv_events.py encodes them (tagged maps with
// event_version, typed extra keys, group_idx, kv_cache_spec_kind,
// locality, ownership, session_id, and a class this package does not
// know) and whose replay socket answers [topic, seq, payload] as vLLM's
// does since 2026. The blocks in the engine's own GPU memory of the first
// group are indexed, the others are not, no batch is malformed, and a
// batch lost on the live stream is replayed.
func TestInteropNewestVLLM(t *testing.T) {
	python := python(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pubPort, replayPort := freePort(t), freePort(t)
	py := startScript(t, ctx, python, "testdata/vllm_publisher.py", strconv.Itoa(pubPort), strconv.Itoa(replayPort), "kv-events", strconv.Itoa(testBlock), "topic")
	py.expect("ready")
	step := func(name string) { py.send(name); py.expect("done " + name) }

	idx, h := newTestIndex(t)
	salt := prefix.Salt{Model: "m"}
	sub, err := NewSubscriber(Config{Index: idx, Hasher: h, MinBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond})
	require.NoError(t, err)
	require.NoError(t, sub.SetEndpoints(map[string]Endpoint{"vllm": {
		PubAddr:    fmt.Sprintf("tcp://127.0.0.1:%d", pubPort),
		ReplayAddr: fmt.Sprintf("tcp://127.0.0.1:%d", replayPort),
		Topic:      "kv-events",
		Salt:       salt,
	}}))
	var wg sync.WaitGroup
	subCtx, stopSub := context.WithCancel(ctx)
	wg.Go(func() { _ = sub.Run(subCtx) })
	defer wg.Wait()
	defer stopSub()
	stats := func() Stats { s, _ := sub.Stats("vllm"); return s }
	require.Eventually(t, func() bool { step("warm"); return stats().Batches > 0 }, waitFor, 20*time.Millisecond)

	hashes := func(s prefix.Salt, base uint32, blocks int) []uint64 { return h.HashTokens(s, prompt(base, blocks)) }
	sets := map[string][]uint64{
		"f": hashes(salt, 10000, 2), "g": hashes(salt, 11000, 2),
		"lora":   hashes(prefix.Salt{Model: "m", Adapter: "ad1"}, 12000, 2),
		"remote": hashes(salt, 13000, 2), "window": hashes(salt, 14000, 2), "salted": hashes(salt, 15000, 1),
	}
	waitMatch := func(what string, want map[string]int) {
		t.Helper()
		match := func(k string) int { return idx.MatchLen("vllm", sets[k], time.Now()) }
		if !assert.Eventually(t, func() bool {
			for k, v := range want {
				if match(k) != v {
					return false
				}
			}
			return true
		}, waitFor, tick, what) {
			for k, v := range want {
				t.Logf("%s: %s matches %d blocks, want %d", what, k, match(k), v)
			}
			t.Logf("stats %+v; script stderr:\n%s", stats(), py.stderr)
			t.FailNow()
		}
	}

	step("newest")
	waitMatch("newest", map[string]int{"f": 2, "g": 2, "lora": 2, "remote": 0, "window": 0, "salted": 0})
	before := stats()
	assert.Equal(t, int64(0), before.Malformed)

	step("newest_gap")
	waitMatch("newest_gap", map[string]int{"f": 1, "g": 1, "lora": 2})
	st := stats()
	assert.Equal(t, before.Gaps+1, st.Gaps)
	assert.Equal(t, before.Replayed+1, st.Replayed)
	assert.Equal(t, before.Resets, st.Resets)
	assert.Equal(t, int64(0), st.Malformed)
	py.send("quit")
}

// TestInteropHybridAndSalts subscribes to two pyzmq and msgpack publishers
// that send events as vLLM and SGLang encode them: vLLM's for a model
// mixing attention types (a sliding-window group 0, a full-attention group
// 1, a Mamba group 2, storing and evicting the same blocks), with a cache
// salt in extra_keys and an event_version newer than this package knows;
// SGLang's salted blocks, positional (its metadata where vLLM has
// lora_name, or in the layout KV-aware routers read by position: the salt
// tagged in extra_keys, the metadata after ownership, a REMOTE locality)
// and as tagged maps. Only the full-attention group's blocks are indexed,
// and removed only by its evictions; salted blocks match the prompts of
// the same salt only; the newer event is counted, not indexed.
func TestInteropHybridAndSalts(t *testing.T) {
	python := python(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	engines := map[string]*script{}
	ports := map[string][2]int{}
	for _, name := range []string{"vllm", "sglang"} {
		pubPort, replayPort := freePort(t), freePort(t)
		ports[name] = [2]int{pubPort, replayPort}
		engines[name] = startScript(t, ctx, python, "testdata/vllm_publisher.py", strconv.Itoa(pubPort), strconv.Itoa(replayPort), "kv-events", strconv.Itoa(testBlock))
		engines[name].expect("ready")
	}
	step := func(engine, name string) { engines[engine].send(name); engines[engine].expect("done " + name) }

	idx, h := newTestIndex(t)
	salt := prefix.Salt{Model: "m"}
	sub, err := NewSubscriber(Config{Index: idx, Hasher: h, MinBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond})
	require.NoError(t, err)
	eps := map[string]Endpoint{}
	for name, p := range ports {
		eps[name] = Endpoint{
			PubAddr:    fmt.Sprintf("tcp://127.0.0.1:%d", p[0]),
			ReplayAddr: fmt.Sprintf("tcp://127.0.0.1:%d", p[1]),
			Topic:      "kv-events",
			Salt:       salt,
		}
	}
	require.NoError(t, sub.SetEndpoints(eps))
	var wg sync.WaitGroup
	subCtx, stopSub := context.WithCancel(ctx)
	wg.Go(func() { _ = sub.Run(subCtx) })
	defer wg.Wait()
	defer stopSub()
	stats := func(name string) Stats { s, _ := sub.Stats(name); return s }
	for name := range engines {
		require.Eventually(t, func() bool { step(name, "warm"); return stats(name).Batches > 0 }, waitFor, 20*time.Millisecond)
	}

	tenant := prefix.Salt{Model: "m", Namespace: "tenant"}
	type set struct {
		engine string
		hashes []uint64
	}
	sets := map[string]set{
		"hybrid":              {"vllm", h.HashTokens(salt, prompt(20000, 2))},
		"salted":              {"vllm", h.HashTokens(tenant, prompt(21000, 2))},
		"salted unsalted":     {"vllm", h.HashTokens(salt, prompt(21000, 2))},
		"newer":               {"vllm", h.HashTokens(salt, prompt(22000, 1))},
		"positional":          {"sglang", h.HashTokens(tenant, prompt(30000, 3))},
		"positional unsalted": {"sglang", h.HashTokens(salt, prompt(30000, 3))},
		"map":                 {"sglang", h.HashTokens(tenant, prompt(31000, 3))},
		"map other salt":      {"sglang", h.HashTokens(prefix.Salt{Model: "m", Namespace: "other"}, prompt(31000, 3))},
		"layout":              {"sglang", h.HashTokens(tenant, prompt(32000, 3))},
		"layout tagged":       {"sglang", h.HashTokens(prefix.Salt{Model: "m", Namespace: "dynamo-cache-salt:tenant"}, prompt(32000, 3))},
		"layout remote":       {"sglang", h.HashTokens(salt, prompt(33000, 2))},
	}
	waitMatch := func(what string, want map[string]int) {
		t.Helper()
		match := func(k string) int { return idx.MatchLen(sets[k].engine, sets[k].hashes, time.Now()) }
		if !assert.Eventually(t, func() bool {
			for k, v := range want {
				if match(k) != v {
					return false
				}
			}
			return true
		}, waitFor, tick, what) {
			for k, v := range want {
				t.Logf("%s: %s matches %d blocks, want %d", what, k, match(k), v)
			}
			t.Logf("stats %+v %+v; stderr:\n%s\n%s", stats("vllm"), stats("sglang"), engines["vllm"].stderr, engines["sglang"].stderr)
			t.FailNow()
		}
	}

	step("vllm", "hybrid")
	step("sglang", "sglang")
	step("sglang", "sglang_layout")
	waitMatch("stored", map[string]int{"hybrid": 2, "salted": 2, "salted unsalted": 0, "newer": 0,
		"positional": 3, "positional unsalted": 0, "map": 3, "map other salt": 0,
		"layout": 3, "layout tagged": 0, "layout remote": 0})
	step("sglang", "sglang_layout_evict")
	waitMatch("layout evicted", map[string]int{"layout": 2, "map": 3})

	step("vllm", "hybrid_evict")
	waitMatch("evicted", map[string]int{"hybrid": 1})
	// The batches before the last one matched are applied whole.
	assert.Equal(t, 0, idx.MatchLen("vllm", sets["newer"].hashes, time.Now()))
	st := stats("vllm")
	assert.Equal(t, int64(1), st.Unknown, "the newer event_version")
	assert.Equal(t, int64(2+2), st.Stored, "the hybrid blocks stored once, the salted ones")
	for name := range engines {
		assert.Equal(t, int64(0), stats(name).Malformed, name)
		engines[name].send("quit")
	}
}

// deref returns *p, or the zero value for nil.
func deref[T any](p *T) T {
	var v T
	if p != nil {
		v = *p
	}
	return v
}

// pyEvent is an event as testdata/vllm_subscriber.py prints it.
type pyEvent struct {
	Seq         int64    `json:"seq"`
	Type        string   `json:"type"`
	BlockHashes []uint64 `json:"block_hashes"`
	Parent      *uint64  `json:"parent"`
	TokenIDs    []uint32 `json:"token_ids"`
	BlockSize   int      `json:"block_size"`
	Medium      *string  `json:"medium"`
	LoRAName    *string  `json:"lora_name"`
	CacheSalt   *string  `json:"cache_salt"`
	Group       *int     `json:"group_idx"`
	GroupKind   *string  `json:"kv_cache_spec_kind"`
}

// TestInteropPythonSubscriber has a pyzmq and msgpack consumer written to
// vLLM's positional schema follow this package's Publisher: batches
// published before it connected arrive by replay, later ones live, and
// every field decodes as vLLM's consumers expect, the LoRA name, cache
// salt (in extra_keys), KV-cache group and its type included.
func TestInteropPythonSubscriber(t *testing.T) {
	python := python(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pubAddr, replayAddr := freeAddr(t), freeAddr(t)
	p, err := NewPublisher(PublisherConfig{Endpoint: pubAddr, ReplayEndpoint: replayAddr, Topic: "kv-events"})
	require.NoError(t, err)
	var wg sync.WaitGroup
	pctx, stopPub := context.WithCancel(ctx)
	wg.Go(func() { _ = p.Run(pctx) })
	defer wg.Wait()
	defer stopPub()

	early := []Event{
		{Kind: Stored, BlockHashes: []uint64{1<<64 - 1, 2}, TokenIDs: prompt(1, 2), BlockSize: testBlock, Medium: "GPU"},
		{Kind: Removed, BlockHashes: []uint64{2}, Medium: "GPU"},
		{Kind: Cleared},
	}
	late := []Event{
		{Kind: Stored, BlockHashes: []uint64{7}, Parent: 1<<64 - 1, HasParent: true, TokenIDs: prompt(9, 1), BlockSize: testBlock, Medium: "GPU", LoRA: "ad"},
		{Kind: Stored, BlockHashes: []uint64{8}, TokenIDs: prompt(5, 1), BlockSize: testBlock, Medium: "GPU", Group: 1},
		{Kind: Stored, BlockHashes: []uint64{9, 10}, TokenIDs: prompt(6, 2), BlockSize: testBlock, Medium: "GPU", LoRA: "ad",
			CacheSalt: "tenant", Group: 2, GroupKind: "full_attention"},
		{Kind: Stored, BlockHashes: []uint64{11}, TokenIDs: prompt(7, 1), BlockSize: testBlock, Medium: "GPU", CacheSalt: "t2"},
	}
	p.Publish(&Batch{TS: 1, DPRank: 0, Events: early[:2]})
	p.Publish(&Batch{TS: 2, DPRank: 0, Events: early[2:]})

	py := startScript(t, ctx, python, "testdata/vllm_subscriber.py", pubAddr, replayAddr, "kv-events")
	var got []pyEvent
	next := func() pyEvent {
		l := py.expect("{")
		var ev pyEvent
		require.NoError(t, json.Unmarshal([]byte(l), &ev), l)
		return ev
	}
	for ev := next(); ev.Type != "ReplayEnd"; ev = next() {
		got = append(got, ev)
	}
	require.Len(t, got, len(early))
	p.Publish(&Batch{TS: 3, DPRank: 0, Events: late})
	for len(got) < len(early)+len(late) {
		select {
		case l, ok := <-py.lines:
			require.True(t, ok, "script exited; stderr:\n%s", py.stderr)
			var ev pyEvent
			require.NoError(t, json.Unmarshal([]byte(l), &ev), l)
			if ev.Type != "ReplayEnd" {
				got = append(got, ev)
			}
		case <-time.After(50 * time.Millisecond):
			p.Publish(&Batch{TS: 4, DPRank: 0}) // lets a late subscription see the gap
		case <-ctx.Done():
			t.Fatalf("events so far %+v; stderr:\n%s", got, py.stderr)
		}
	}
	want := append(append([]Event(nil), early...), late...)
	seqs := []int64{0, 0, 1, 2, 2, 2, 2}
	for i, w := range want {
		g := got[i]
		assert.Equal(t, seqs[i], g.Seq, "event %d", i)
		assert.Equal(t, w.Kind.String(), g.Type, "event %d", i)
		if w.Kind == Cleared {
			continue
		}
		assert.Equal(t, w.BlockHashes, g.BlockHashes, "event %d", i)
		require.NotNil(t, g.Medium)
		assert.Equal(t, w.Medium, *g.Medium)
		if w.Kind == Stored {
			assert.Equal(t, w.TokenIDs, g.TokenIDs, "event %d", i)
			assert.Equal(t, w.BlockSize, g.BlockSize, "event %d", i)
			if w.HasParent {
				require.NotNil(t, g.Parent, "event %d", i)
				assert.Equal(t, w.Parent, *g.Parent, "event %d", i)
			} else {
				assert.Nil(t, g.Parent, "event %d", i)
			}
			assert.Equal(t, w.LoRA, deref(g.LoRAName), "event %d: lora_name", i)
			assert.Equal(t, w.CacheSalt, deref(g.CacheSalt), "event %d: cache salt", i)
			assert.Equal(t, w.Group, deref(g.Group), "event %d: group_idx", i)
			assert.Equal(t, w.GroupKind, deref(g.GroupKind), "event %d: kv_cache_spec_kind", i)
		}
	}
	py.send("quit")
}
