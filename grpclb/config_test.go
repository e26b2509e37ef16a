package grpclb_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/balancer"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/grpclb"
	"github.com/llmlb/llmlb/prefix"
)

func newTestBuilder(t testing.TB) *grpclb.Builder {
	t.Helper()
	b, err := grpclb.NewBuilder(grpclb.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestParseConfig(t *testing.T) {
	b := newTestBuilder(t)
	ms := func(d time.Duration) grpclb.Duration { return grpclb.Duration(d) }
	for _, tc := range []struct {
		name    string
		js      string
		check   func(c *grpclb.Config) bool
		wantErr string // substring of the error; "" means success
	}{
		{name: "empty object", js: `{}`, check: func(c *grpclb.Config) bool { return c.Policy == "default" }},
		{name: "null", js: `null`, check: func(c *grpclb.Config) bool { return c.Policy == "default" }},
		{name: "empty", js: ``, check: func(c *grpclb.Config) bool { return c.Policy == "default" }},
		{name: "default with parameters", js: `{"policy": "default", "decodeAllowance": 128, "slowStartWindow": "10s",
			"blockTokens": 32, "cacheWeight": 2, "sampled": 4, "slots": 4, "slotWeight": 5, "maxSignalAge": "1.5s", "oobReportInterval": "250ms",
			"overloadWeight": 16, "overloadQueue": 1, "defaultQueueWeight": 2}`,
			check: func(c *grpclb.Config) bool {
				return *c.DecodeAllowance == 128 && c.SlowStartWindow == ms(10*time.Second) && c.BlockTokens == 32 &&
					c.CacheWeight == 2 && c.Sampled == 4 && c.Slots == 4 && c.SlotWeight == 5 && c.MaxSignalAge == ms(1500*time.Millisecond) &&
					c.OOBReportInterval == ms(250*time.Millisecond) && c.OverloadWeight == 16 && c.OverloadQueue == 1 && c.DefaultQueueWeight == 2
			}},
		{name: "p2c kv", js: `{"policy": "p2c", "score": "kv"}`, check: func(c *grpclb.Config) bool { return c.Score == "kv" }},
		{name: "least-score tokens", js: `{"policy": "least-score", "score": "tokens"}`},
		{name: "weighted least request", js: `{"policy": "weighted-least-request", "bias": 0}`,
			check: func(c *grpclb.Config) bool { return c.Bias != nil && *c.Bias == 0 }},
		{name: "consistent hash", js: `{"policy": "consistent-hash", "hashBalance": 1.5, "ringReplicas": 100}`},
		{name: "prefix hash", js: `{"policy": "prefix-hash", "prefixTokens": 128, "blockTokens": 16, "loadFactor": 2}`},
		{name: "prefix aware", js: `{"policy": "prefix-aware", "absThreshold": 10, "relThreshold": 2, "matchThreshold": 0.5}`},
		{name: "sglang cache aware", js: `{"policy": "sglang-cache-aware"}`},
		{name: "dynamo kv", js: `{"policy": "dynamo-kv", "temperature": 0.5, "decayK": 1}`},
		{name: "dynamo kv overlap score weight", js: `{"policy": "dynamo-kv", "overlapScoreWeight": 2}`,
			check: func(c *grpclb.Config) bool { return c.OverlapScoreWeight != nil && *c.OverlapScoreWeight == 2 }},
		{name: "gie", js: `{"policy": "gie-default", "queueWeight": 1, "kvWeight": 1, "prefixWeight": 1}`},
		{name: "baselines", js: `{"policy": "round-robin", "slowStartWindow": "5s", "slowStartAggression": 2}`},
		{name: "default without learning", js: `{"policy": "default", "disableLearning": true}`, check: func(c *grpclb.Config) bool { return c.DisableLearning }},
		{name: "default with objectives", js: `{"policy": "default", "ttftObjective": "2s", "tpotObjective": "0.05s"}`, check: func(c *grpclb.Config) bool {
			return time.Duration(c.TTFTObjective) == 2*time.Second && time.Duration(c.TPOTObjective) == 50*time.Millisecond
		}},
		{name: "one objective", js: `{"policy": "default", "tpotObjective": "50ms"}`, wantErr: "must be both positive or both zero"},
		{name: "objectives are default's", js: `{"policy": "p2c", "ttftObjective": "1s"}`,
			wantErr: `parameter "ttftObjective" does not apply to policy "p2c"`},
		{name: "null is unset", js: `{"policy": null, "maxSignalAge": null, "slowStartWindow": null, "decodeAllowance": null}`,
			check: func(c *grpclb.Config) bool {
				return c.Policy == "default" && c.MaxSignalAge == 0 && c.SlowStartWindow == 0 && c.DecodeAllowance == nil
			}},
		{name: "peak ewma", js: `{"policy": "peak-ewma", "peakDecay": "5s"}`,
			check: func(c *grpclb.Config) bool { return c.PeakDecay == ms(5*time.Second) }},

		{name: "not an object", js: `[1]`, wantErr: "must be a JSON object"},
		{name: "malformed", js: `{"policy": `, wantErr: "must be a JSON object"},
		{name: "unknown policy", js: `{"policy": "fastest"}`, wantErr: `unknown policy "fastest"`},
		{name: "policy not a string", js: `{"policy": 3}`, wantErr: "policy must be a string"},
		{name: "unknown parameter", js: `{"policy": "p2c", "scor": "kv"}`, wantErr: `unknown parameter "scor"`},
		{name: "parameter of another policy", js: `{"policy": "round-robin", "score": "kv"}`,
			wantErr: `parameter "score" does not apply to policy "round-robin"`},
		{name: "learning is default's", js: `{"policy": "p2c", "disableLearning": true}`,
			wantErr: `parameter "disableLearning" does not apply to policy "p2c"`},
		{name: "learn is gone", js: `{"policy": "default", "learn": true}`, wantErr: `unknown parameter "learn"`},
		{name: "negative peak decay", js: `{"policy": "peak-ewma", "peakDecay": "-1s"}`, wantErr: "negative"},
		{name: "unknown score", js: `{"policy": "p2c", "score": "latency"}`, wantErr: `unknown score "latency"`},
		{name: "bad duration", js: `{"maxSignalAge": "ten seconds"}`, wantErr: "duration"},
		{name: "numeric duration", js: `{"maxSignalAge": 10}`, wantErr: "duration must be a string"},
		{name: "negative duration", js: `{"slowStartWindow": "-1s"}`, wantErr: "negative"},
		{name: "negative allowance", js: `{"decodeAllowance": -1}`, wantErr: "decode allowance"},
		{name: "wrong type", js: `{"decodeAllowance": "many"}`, wantErr: "decodeAllowance"},
		{name: "hash balance below 1", js: `{"policy": "consistent-hash", "hashBalance": 0.5}`, wantErr: "hash balance"},
		{name: "negative bias", js: `{"policy": "weighted-least-request", "bias": -1}`, wantErr: "bias"},
		{name: "negative block tokens", js: `{"blockTokens": -16}`, wantErr: "blockTokens"},
		{name: "match threshold above 1", js: `{"policy": "prefix-aware", "matchThreshold": 2}`, wantErr: "match threshold"},
		{name: "negative cache weight", js: `{"cacheWeight": -1}`, wantErr: "CacheWeight"},
		{name: "negative slots", js: `{"slots": -4}`, wantErr: "Slots"},
		{name: "negative overload weight", js: `{"overloadWeight": -1}`, wantErr: "OverloadWeight"},
		{name: "negative overload queue", js: `{"overloadQueue": -0.5}`, wantErr: "OverloadQueue"},
		{name: "negative overlap score weight", js: `{"policy": "dynamo-kv", "overlapScoreWeight": -1}`, wantErr: "OverlapScoreWeight"},
		{name: "negative default queue weight", js: `{"defaultQueueWeight": -2}`, wantErr: "QueueWeight"},
		{name: "bad slow start", js: `{"slowStartWindow": "1s", "slowStartMinWeightPercent": 200}`, wantErr: "min weight percent"},
		{name: "bad slow start without a window", js: `{"slowStartMinWeightPercent": 1e308}`, wantErr: "min weight percent"},
		{name: "trailing data", js: `{} {}`, wantErr: "invalid config"},
		{name: "too large", js: `{"policy": "` + strings.Repeat("x", 70<<10) + `"}`, wantErr: "bytes, above"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := b.ParseConfig(json.RawMessage(tc.js))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !errors.Is(err, grpclb.ErrInvalidConfig) {
					t.Fatalf("ParseConfig(%s) error = %v, want one wrapping ErrInvalidConfig containing %q", tc.js, err, tc.wantErr)
				}
				if !strings.HasPrefix(err.Error(), "grpclb: ") {
					t.Errorf("error %q lacks the package prefix", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseConfig(%s): %v", tc.js, err)
			}
			c, ok := got.(*grpclb.Config)
			if !ok {
				t.Fatalf("ParseConfig returned %T, want *grpclb.Config", got)
			}
			if tc.check != nil && !tc.check(c) {
				t.Errorf("ParseConfig(%s) = %+v", tc.js, c)
			}
		})
	}
}

// TestParseConfigEveryPolicy parses a config naming each policy.
func TestParseConfigEveryPolicy(t *testing.T) {
	b := newTestBuilder(t)
	names := grpclb.Policies()
	if len(names) < 15 {
		t.Fatalf("Policies() = %v, want at least 15", names)
	}
	for _, name := range names {
		js, _ := json.Marshal(map[string]string{"policy": name})
		if _, err := b.ParseConfig(js); err != nil {
			t.Errorf("policy %q: %v", name, err)
		}
	}
}

// TestDurationRoundTrip checks that a Duration marshals to what it parses.
func TestDurationRoundTrip(t *testing.T) {
	for _, d := range []time.Duration{0, time.Millisecond, 1500 * time.Millisecond, 3 * time.Minute} {
		js, err := json.Marshal(grpclb.Duration(d))
		if err != nil {
			t.Fatal(err)
		}
		var got grpclb.Duration
		if err := json.Unmarshal(js, &got); err != nil || time.Duration(got) != d {
			t.Errorf("%v -> %s -> %v, %v", d, js, time.Duration(got), err)
		}
	}
}

// FuzzParseConfig checks that ParseConfig never panics, that every error
// wraps ErrInvalidConfig, and that an accepted config parses again to the
// same config after marshaling.
func FuzzParseConfig(f *testing.F) {
	for _, s := range []string{
		`{}`, `null`, ``, `{"policy": "p2c", "score": "kv"}`, `{"policy": "default", "slowStartWindow": "10s", "cacheWeight": 3}`,
		`{"policy": "dynamo-kv", "temperature": 0.5}`, `{"policy": "consistent-hash", "hashBalance": 1e308}`,
		`{"decodeAllowance": 9223372036854775807}`, `{"maxSignalAge": "9999999h"}`, `{"policy": "x"}`, `{"a": 1}`, `[`, `"s"`,
		`{"policy": "prefix-hash", "prefixTokens": -1}`, `{"policy": "gie-default", "queueWeight": 1e400}`,
	} {
		f.Add([]byte(s))
	}
	b := newTestBuilder(f)
	f.Fuzz(func(t *testing.T, js []byte) {
		got, err := b.ParseConfig(js)
		if err != nil {
			if !errors.Is(err, grpclb.ErrInvalidConfig) {
				t.Fatalf("error %v does not wrap ErrInvalidConfig", err)
			}
			return
		}
		c := got.(*grpclb.Config)
		again, err := json.Marshal(c)
		if err != nil {
			t.Fatalf("marshal accepted config: %v", err)
		}
		got2, err := b.ParseConfig(again)
		if err != nil {
			t.Fatalf("accepted %s but not its re-marshaled form %s: %v", js, again, err)
		}
		again2, _ := json.Marshal(got2)
		if string(again) != string(again2) {
			t.Fatalf("round trip changed the config: %s -> %s", again, again2)
		}
	})
}

// TestSharedIndex checks that Options.Index is the prefix-aware policies'
// index: its block size is enforced and picks are recorded in it.
func TestSharedIndex(t *testing.T) {
	ix, err := prefix.NewIndex(prefix.IndexConfig{BlockSize: 32})
	if err != nil {
		t.Fatal(err)
	}
	b, err := grpclb.NewBuilder(grpclb.Options{Index: ix})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.ParseConfig(json.RawMessage(`{"policy": "prefix-aware", "blockTokens": 16}`)); !errors.Is(err, grpclb.ErrInvalidConfig) {
		t.Fatalf("blockTokens 16 with a 32-token index: %v, want ErrInvalidConfig", err)
	}
	for _, js := range []string{`{"policy": "prefix-aware", "blockTokens": 32}`, `{"policy": "default"}`} {
		if _, err := b.ParseConfig(json.RawMessage(js)); err != nil {
			t.Fatalf("%s: %v", js, err)
		}
	}
	p, closeFn := readyPicker(t, b, `{"policy": "prefix-aware"}`, 3)
	defer closeFn()
	// A pick grpc discards (a zero DoneInfo: the RPC was not sent) leaves
	// nothing in the index; one whose RPC was sent leaves its blocks.
	blocks := []uint64{11, 22, 33, 44}
	for _, sent := range []bool{false, true} {
		ctx := grpclb.WithRequest(context.Background(), &llmlb.Request{PromptTokens: 128, Prefix: blocks})
		r, err := p.Pick(balancer.PickInfo{Ctx: ctx})
		if err != nil {
			t.Fatal(err)
		}
		r.Done(balancer.DoneInfo{BytesSent: sent, BytesReceived: sent})
		key := r.SubConn.(*fakeSC).addr
		want := 0
		if sent {
			want = len(blocks)
		}
		if got := ix.MatchLen(key, blocks, time.Now()); got != want {
			t.Errorf("RPC sent %v: shared index matches %d blocks on the picked endpoint %s, want %d", sent, got, key, want)
		}
	}
}

// TestEventsIndex checks Options.Events: it must be events-only, its block
// size must match the policy's index, and "default" routes to the endpoint
// the events report holding the prompt.
func TestEventsIndex(t *testing.T) {
	plain, _ := prefix.NewIndex(prefix.IndexConfig{})
	if _, err := grpclb.NewBuilder(grpclb.Options{Events: plain}); !errors.Is(err, grpclb.ErrInvalidOptions) {
		t.Fatalf("Events that is not events-only: %v, want ErrInvalidOptions", err)
	}
	events, _ := prefix.NewIndex(prefix.IndexConfig{BlockSize: 16, EventsOnly: true})
	b, err := grpclb.NewBuilder(grpclb.Options{Events: events})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.ParseConfig(json.RawMessage(`{"policy": "default", "blockTokens": 32}`)); !errors.Is(err, grpclb.ErrInvalidConfig) {
		t.Fatalf("blockTokens 32 with 16-token events: %v, want ErrInvalidConfig", err)
	}
	for i, policy := range []string{"default", "dynamo-kv"} {
		t.Run(policy, func(t *testing.T) { checkEventsRouting(t, b, events, policy, uint64(100*i)) })
	}
}

// checkEventsRouting checks that policy on b routes a prompt (its block
// hashes start at base) to the endpoint that events reports holding it.
func checkEventsRouting(t *testing.T, b *grpclb.Builder, events *prefix.Index, policy string, base uint64) {
	p, closeFn := readyPicker(t, b, `{"policy": "`+policy+`", "blockTokens": 16}`, 3)
	defer closeFn()
	// Learn the endpoints' addresses, then report the prompt on one of them.
	seen := map[string]bool{}
	for range 60 {
		r, err := p.Pick(balancer.PickInfo{Ctx: context.Background()})
		if err != nil {
			t.Fatal(err)
		}
		seen[r.SubConn.(*fakeSC).addr] = true
		r.Done(balancer.DoneInfo{})
	}
	var holder string
	for addr := range seen {
		holder = addr
		break
	}
	blocks := []uint64{base + 5, base + 6, base + 7, base + 8, base + 9, base + 10, base + 11, base + 12}
	if err := events.Stored(holder, 16, blocks...); err != nil {
		t.Fatal(err)
	}
	ctx := grpclb.WithRequest(context.Background(), &llmlb.Request{PromptTokens: 128, Prefix: blocks})
	for range 10 {
		r, err := p.Pick(balancer.PickInfo{Ctx: ctx})
		if err != nil {
			t.Fatal(err)
		}
		if got := r.SubConn.(*fakeSC).addr; got != holder {
			t.Fatalf("picked %s, want %s, which the events report holding the prompt", got, holder)
		}
		r.Done(balancer.DoneInfo{})
	}
}

// TestParseConfigErrorsBounded: a config with a huge malformed value gets
// a short error that names the parameter, not one that quotes the value
// whole.
func TestParseConfigErrorsBounded(t *testing.T) {
	b := newTestBuilder(t)
	long := strings.Repeat("9", 60<<10)
	for _, tc := range []struct {
		name, js, want string
	}{
		{"huge int", `{"decodeAllowance": ` + long + `}`, `parameter "decodeAllowance": a JSON number does not fit int`},
		{"fraction for an int", `{"policy": "consistent-hash", "ringReplicas": 1.` + long + `}`, `parameter "ringReplicas": a JSON number does not fit int`},
		{"float out of range", `{"cacheWeight": 1` + long + `}`, `parameter "cacheWeight": a JSON number does not fit float64`},
		{"pointer to float out of range", `{"policy": "dynamo-kv", "temperature": -1` + long + `}`, `parameter "temperature": a JSON number does not fit float64`},
		{"string for a bool", `{"disableLearning": "` + long + `"}`, `parameter "disableLearning": a JSON string does not fit bool`},
		{"duration out of range", `{"maxSignalAge": "` + long + `h"}`, "is malformed or out of range"},
		{"malformed duration", `{"slowStartWindow": "` + strings.Repeat("x", 60<<10) + `"}`, "is malformed or out of range"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := b.ParseConfig(json.RawMessage(tc.js))
			if err == nil || !errors.Is(err, grpclb.ErrInvalidConfig) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error = %.300v, want one wrapping ErrInvalidConfig containing %q", err, tc.want)
			}
			if n := len(err.Error()); n > 256 {
				t.Errorf("error is %d bytes: %.300s...", n, err)
			}
		})
	}
}
