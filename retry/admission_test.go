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
