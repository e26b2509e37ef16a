package retry

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func overload(t *testing.T, err error, scope string) {
	t.Helper()
	var oe *OverloadError
	if !errors.Is(err, ErrOverloaded) || !errors.As(err, &oe) || oe.Scope != scope || oe.RetryAfter != time.Second {
		t.Fatalf("err = %v, want an overload of scope %q with a 1 s Retry-After", err, scope)
	}
}

func TestAdmissionGlobal(t *testing.T) {
	a, err := NewAdmission(AdmissionConfig{MaxInFlight: 2})
	if err != nil {
		t.Fatal(err)
	}
	r1, err1 := a.Acquire("")
	r2, err2 := a.Acquire("")
	if err1 != nil || err2 != nil {
		t.Fatal(err1, err2)
	}
	_, err = a.Acquire("")
	overload(t, err, "global")
	r1()
	r1() // no-op
	if a.InFlight() != 1 {
		t.Fatalf("InFlight = %d after a double release", a.InFlight())
	}
	r3, err := a.Acquire("")
	if err != nil {
		t.Fatal(err)
	}
	r2()
	r3()
	if a.InFlight() != 0 {
		t.Fatalf("InFlight = %d", a.InFlight())
	}
}

func TestAdmissionSessions(t *testing.T) {
	a, _ := NewAdmission(AdmissionConfig{MaxPerSession: 2, MaxSessions: 2})
	s1a, _ := a.Acquire("s1")
	s1b, _ := a.Acquire("s1")
	_, err := a.Acquire("s1")
	overload(t, err, "session")
	s2, err := a.Acquire("s2")
	if err != nil {
		t.Fatal(err)
	}
	if a.InFlight() != 3 || a.Sessions() != 2 {
		t.Fatalf("InFlight %d, Sessions %d", a.InFlight(), a.Sessions())
	}
	s1a()
	s1b()
	s1b()
	if a.Sessions() != 1 {
		t.Fatalf("Sessions = %d after s1 ended", a.Sessions())
	}
	// s1 was forgotten when it ended, so it starts afresh.
	s1c, _ := a.Acquire("s1")
	s1d, err := a.Acquire("s1")
	if err != nil {
		t.Fatalf("s1 refused after its earlier requests ended: %v", err)
	}
	s1c()
	s1d()
	s2()
	if a.InFlight() != 0 || a.Sessions() != 0 {
		t.Fatalf("InFlight %d, Sessions %d at the end", a.InFlight(), a.Sessions())
	}
}

// TestAdmissionNoSessionCap: without a per-session cap, sessions are not
// tracked, and requests of a session count only globally, as those of no
// session do.
func TestAdmissionNoSessionCap(t *testing.T) {
	a, _ := NewAdmission(AdmissionConfig{MaxInFlight: 2})
	r1, err1 := a.Acquire("s1")
	r2, err2 := a.Acquire("s1")
	if err1 != nil || err2 != nil {
		t.Fatal(err1, err2)
	}
	_, err := a.Acquire("s2")
	overload(t, err, "global")
	if a.InFlight() != 2 || a.Sessions() != 0 {
		t.Fatalf("InFlight %d, Sessions %d; want 2 and none tracked", a.InFlight(), a.Sessions())
	}
	r1()
	r1() // no-op
	r3, err := a.Acquire("")
	if err != nil {
		t.Fatal(err)
	}
	r2()
	r3()
	if a.InFlight() != 0 {
		t.Fatalf("InFlight = %d at the end", a.InFlight())
	}

	free, _ := NewAdmission(AdmissionConfig{})
	var releases []func()
	for i := range 100 {
		r, err := free.Acquire(fmt.Sprint("s", i%10))
		if err != nil {
			t.Fatal(err)
		}
		releases = append(releases, r)
	}
	if free.InFlight() != 100 || free.Sessions() != 0 {
		t.Fatalf("InFlight %d, Sessions %d; want 100 and none tracked", free.InFlight(), free.Sessions())
	}
	for _, r := range releases {
		r()
	}
	if free.InFlight() != 0 {
		t.Fatalf("InFlight = %d at the end", free.InFlight())
	}
}

// TestAdmissionForgetsLeastRecent checks the LRU: a session beyond
// MaxSessions is admitted and forgets the least recently admitted one, whose
// requests still release their own count.
func TestAdmissionForgetsLeastRecent(t *testing.T) {
	a, _ := NewAdmission(AdmissionConfig{MaxPerSession: 1, MaxSessions: 2})
	r1, _ := a.Acquire("s1")
	r2, _ := a.Acquire("s2")
	r3, err := a.Acquire("s3") // forgets s1, the least recently admitted
	if err != nil {
		t.Fatalf("a new session was refused: %v", err)
	}
	if a.Sessions() != 2 {
		t.Fatalf("Sessions = %d, want the cap 2", a.Sessions())
	}
	_, err = a.Acquire("s2") // still tracked: at its cap
	overload(t, err, "session")
	_, err = a.Acquire("s3")
	overload(t, err, "session")
	// s1 is counted afresh (forgetting s2, now the least recent).
	r1b, err := a.Acquire("s1")
	if err != nil {
		t.Fatalf("forgotten s1 refused: %v", err)
	}
	_, err = a.Acquire("s1")
	overload(t, err, "session")
	// The first s1 request releases its own, forgotten count: the fresh
	// one still holds s1 at its cap.
	r1()
	_, err = a.Acquire("s1")
	overload(t, err, "session")
	for _, r := range []func(){r2, r3, r1b} {
		r()
	}
	if a.InFlight() != 0 || a.Sessions() != 0 {
		t.Fatalf("InFlight %d, Sessions %d at the end", a.InFlight(), a.Sessions())
	}
}

func TestAdmissionConcurrent(t *testing.T) {
	a, _ := NewAdmission(AdmissionConfig{MaxInFlight: 8, MaxPerSession: 3, MaxSessions: 6})
	var inflight, peak atomic.Int64
	perSession := make([]atomic.Int64, 6)
	var wg sync.WaitGroup
	for g := 0; g < 16; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 500; i++ {
				s := (g + i) % 6
				release, err := a.Acquire(fmt.Sprint("s", s))
				if err != nil {
					if !errors.Is(err, ErrOverloaded) {
						t.Error(err)
					}
					continue
				}
				n := inflight.Add(1)
				for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
				}
				if perSession[s].Add(1) > 3 {
					t.Error("session cap exceeded")
				}
				perSession[s].Add(-1)
				inflight.Add(-1)
				release()
				release()
			}
		}()
	}
	wg.Wait()
	if peak.Load() > 8 {
		t.Fatalf("peak in flight %d above the cap 8", peak.Load())
	}
	if a.InFlight() != 0 || a.Sessions() != 0 {
		t.Fatalf("InFlight %d, Sessions %d at the end", a.InFlight(), a.Sessions())
	}
}

func TestAdmissionBadConfig(t *testing.T) {
	for _, cfg := range []AdmissionConfig{
		{MaxInFlight: -1}, {MaxPerSession: -1}, {MaxSessions: -1}, {RetryAfter: -time.Second},
	} {
		if _, err := NewAdmission(cfg); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("NewAdmission(%+v) = %v", cfg, err)
		}
	}
}

// TestAdmissionConcurrentForgetting churns more sessions than MaxSessions
// from many goroutines: the global cap holds throughout and every count
// returns to zero.
func TestAdmissionConcurrentForgetting(t *testing.T) {
	a, _ := NewAdmission(AdmissionConfig{MaxInFlight: 8, MaxPerSession: 2, MaxSessions: 3})
	var inflight atomic.Int64
	var wg sync.WaitGroup
	for g := 0; g < 16; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 500; i++ {
				release, err := a.Acquire(fmt.Sprint("s", (g*7+i)%10))
				if err != nil {
					if !errors.Is(err, ErrOverloaded) {
						t.Error(err)
					}
					continue
				}
				if inflight.Add(1) > 8 {
					t.Error("global cap exceeded")
				}
				if n := a.Sessions(); n > 3 {
					t.Errorf("%d sessions tracked, cap 3", n)
				}
				inflight.Add(-1)
				release()
			}
		}()
	}
	wg.Wait()
	if a.InFlight() != 0 || a.Sessions() != 0 {
		t.Fatalf("InFlight %d, Sessions %d at the end", a.InFlight(), a.Sessions())
	}
}

// TestAdmissionGlobalNoSpuriousRefusal interleaves two admissions at the
// global cap of 1: A reads the count while another request holds the only
// slot; that request is then released and B asks, before A decides. B must
// be admitted, since no request is in flight when it asks, and A refused.
// Counting A's request before checking it against the cap, and uncounting
// it on refusal, refused both.
func TestAdmissionGlobalNoSpuriousRefusal(t *testing.T) {
	a, _ := NewAdmission(AdmissionConfig{MaxInFlight: 1})
	held, err := a.Acquire("")
	if err != nil {
		t.Fatal(err)
	}
	var (
		fired bool
		relB  func()
		errB  error
	)
	a.testHook = func() {
		if fired {
			return
		}
		fired = true
		held()
		relB, errB = a.Acquire("")
	}
	_, errA := a.Acquire("")
	if !fired {
		t.Fatal("the hook was not called")
	}
	if errB != nil {
		t.Fatalf("B refused with nothing in flight: %v", errB)
	}
	overload(t, errA, "global")
	if a.InFlight() != 1 {
		t.Fatalf("InFlight = %d with B admitted", a.InFlight())
	}
	relB()
	if a.InFlight() != 0 {
		t.Fatalf("InFlight = %d at the end", a.InFlight())
	}
}

// TestAdmissionSessionNoSpuriousRefusal checks that a request refused for
// its session holds no global slot while it is refused: with one request of
// s1 in flight, a global cap of 2 and a session cap of 1, a request without
// a session is admitted while a second request of s1 is being refused.
func TestAdmissionSessionNoSpuriousRefusal(t *testing.T) {
	a, _ := NewAdmission(AdmissionConfig{MaxInFlight: 2, MaxPerSession: 1})
	held, err := a.Acquire("s1")
	if err != nil {
		t.Fatal(err)
	}
	var (
		fired bool
		relB  func()
		errB  error
	)
	runB := func() {
		if fired {
			return
		}
		fired = true
		relB, errB = a.Acquire("")
	}
	a.testHook = runB // B asks while A is being decided, if A reads the global count
	_, errA := a.Acquire("s1")
	runB() // otherwise, right after
	overload(t, errA, "session")
	if errB != nil {
		t.Fatalf("B refused with one request in flight and a cap of 2: %v", errB)
	}
	if a.InFlight() != 2 {
		t.Fatalf("InFlight = %d with s1 and B admitted", a.InFlight())
	}
	relB()
	held()
	if a.InFlight() != 0 || a.Sessions() != 0 {
		t.Fatalf("InFlight %d, Sessions %d at the end", a.InFlight(), a.Sessions())
	}
}

// TestAdmissionConcurrentNoSpuriousRefusal runs, against a global cap of 4,
// one request of s1 held throughout, goroutines that keep asking for s1
// (always refused at its cap of 1) and two goroutines that each keep one
// request without a session in flight at most. At most 3 requests are ever
// admitted, so those two must never be refused, and the count must never
// exceed the cap and must return to zero.
func TestAdmissionConcurrentNoSpuriousRefusal(t *testing.T) {
	const maxInFlight, iters = 4, 3000
	a, _ := NewAdmission(AdmissionConfig{MaxInFlight: maxInFlight, MaxPerSession: 1})
	held, err := a.Acquire("s1")
	if err != nil {
		t.Fatal(err)
	}
	var stop atomic.Bool
	var refused, spurious atomic.Int64
	var hammers, wg sync.WaitGroup
	for range 3 {
		hammers.Add(1)
		go func() {
			defer hammers.Done()
			for !stop.Load() {
				if _, err := a.Acquire("s1"); err == nil {
					t.Error("s1 admitted beyond its cap")
					return
				}
				refused.Add(1)
			}
		}()
	}
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range iters {
				release, err := a.Acquire("")
				if err != nil {
					spurious.Add(1)
					continue
				}
				if n := a.InFlight(); n > maxInFlight {
					t.Errorf("InFlight = %d above the cap %d", n, maxInFlight)
				}
				release()
			}
		}()
	}
	wg.Wait()
	stop.Store(true)
	hammers.Wait()
	if n := spurious.Load(); n > 0 {
		t.Errorf("%d of %d requests refused with at most %d of %d in flight (%d s1 refusals)",
			n, 2*iters, maxInFlight-1, maxInFlight, refused.Load())
	}
	held()
	if a.InFlight() != 0 || a.Sessions() != 0 {
		t.Fatalf("InFlight %d, Sessions %d at the end", a.InFlight(), a.Sessions())
	}
}
