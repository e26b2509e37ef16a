package llmlb

import (
	"context"
	"testing"
	"unsafe"
)

// TestEpStateLayout checks that an endpoint's state fills a size class whose
// objects start on a cache line, so that no two endpoints share one.
func TestEpStateLayout(t *testing.T) {
	if unsafe.Sizeof(uintptr(0)) != 8 {
		t.Skip("the layout is planned for 64-bit platforms")
	}
	if got := unsafe.Sizeof(epState{}); got != 192 {
		t.Errorf("epState is %d bytes, want 192", got)
	}
	if off := unsafe.Offsetof(epState{}.desc) + unsafe.Sizeof(epState{}.desc); off > 64 {
		t.Errorf("the fields every pick reads end at byte %d, want within the first cache line", off)
	}
	// A pick's record and round robin's counter are written by every pick
	// on their processor, and so must share no line with another's.
	if got := unsafe.Sizeof(record{}); got != 128 {
		t.Errorf("record is %d bytes, want 128", got)
	}
	if got := unsafe.Sizeof(roundRobin{}); got != 64 {
		t.Errorf("roundRobin is %d bytes, want 64", got)
	}
}

// TestCountsSpill checks that counts too large for the packed words (more
// than 65535 outstanding requests, or token sums of 2^32 and more) are kept
// exactly, through first tokens and completions, in any mix with requests
// counted in the packed words.
func TestCountsSpill(t *testing.T) {
	b := mustNew(t, &probe{pick: "ep0"})
	mustUpdate(t, b, eps(2))
	ctx := context.Background()
	type want struct{ out, queued, prefill, decode int64 }
	var w want
	var picks []Pick
	pick := func(r Request) {
		t.Helper()
		p, err := b.Pick(ctx, &r)
		if err != nil {
			t.Fatal(err)
		}
		picks = append(picks, p)
		w.out++
		w.queued++
		w.prefill += int64(r.PromptTokens)
		w.decode += int64(r.OutputTokens)
	}
	check := func(when string) {
		t.Helper()
		s := statsByKey(b)["ep0"]
		if got := (want{s.Outstanding, s.Queued, s.PrefillTokens, s.DecodeTokens}); got != w {
			t.Fatalf("%s: stats %+v, want %+v", when, got, w)
		}
		st := b.snap.Load().byKey["ep0"]
		if got, wantActive := st.promptTokens()+st.decodeTokens(), w.prefill+w.decode; w.queued == w.out && got != wantActive {
			t.Fatalf("%s: active tokens %d, want %d", when, got, wantActive)
		}
	}
	big := Request{PromptTokens: maxTokens, OutputTokens: maxTokens}
	for range 3 {
		pick(big)
		pick(Request{PromptTokens: 100, OutputTokens: 7})
	}
	check("after large requests")
	for range 1<<16 + 10 {
		pick(Request{PromptTokens: 1, OutputTokens: 1})
	}
	check("after 65546 small requests")
	for i, p := range picks {
		if i%3 == 0 {
			p.FirstToken()
			w.queued--
			w.prefill -= int64(p.rec.d1 & low32)
		}
	}
	for _, p := range picks {
		p.Done(nil)
		p.Done(nil)
	}
	w = want{}
	check("after every Done")
	st := b.snap.Load().byKey["ep0"]
	if st.reqs.Load() != 0 || st.toks.Load() != 0 || st.spReqs.Load() != 0 || st.spPrefill.Load() != 0 ||
		st.spPrompt.Load() != 0 || st.spDecode.Load() != 0 {
		t.Fatalf("counters left: %d %d %d %d %d %d", st.reqs.Load(), st.toks.Load(), st.spReqs.Load(),
			st.spPrefill.Load(), st.spPrompt.Load(), st.spDecode.Load())
	}
}

// TestLeastOutstandingSpilled checks that least outstanding counts the
// requests of the spill counters: an endpoint whose packed word holds fewer
// requests than another's but whose total is larger must lose.
func TestLeastOutstandingSpilled(t *testing.T) {
	b := mustNew(t, LeastOutstanding())
	mustUpdate(t, b, eps(2))
	ctx := context.Background()
	pick := func(r Request, want string) Pick {
		t.Helper()
		p, err := b.Pick(ctx, &r)
		if err != nil {
			t.Fatal(err)
		}
		if got := p.Endpoint().Key(); got != want {
			t.Fatalf("picked %s, want %s", got, want)
		}
		return p
	}
	var picks []Pick
	// Two prompts of maxTokens fill ep0's packed prefill; two more spill.
	for range 4 {
		picks = append(picks, pick(Request{PromptTokens: maxTokens, Exclude: []string{"ep1"}}, "ep0"))
	}
	for range 3 {
		picks = append(picks, pick(Request{PromptTokens: 1, Exclude: []string{"ep0"}}, "ep1"))
	}
	st := b.snap.Load().byKey["ep0"]
	if packed := st.reqs.Load() >> 32 & low16; packed != 2 || st.outstanding() != 4 {
		t.Fatalf("ep0 holds %d packed of %d outstanding, want 2 of 4", packed, st.outstanding())
	}
	for range 20 {
		pick(Request{PromptTokens: 1}, "ep1").Done(nil)
	}
	for _, p := range picks {
		p.Done(nil)
	}
}
