package signals

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"
)

// TestReadCappedHugeContentLength: a Content-Length near the int64 maximum
// (which net/http accepts) must not overflow the initial buffer size; the
// body is read, and one longer than the cap fails, instead of spinning on
// an empty buffer.
func TestReadCappedHugeContentLength(t *testing.T) {
	for _, hint := range []int64{math.MaxInt64, math.MaxInt64 - 1} {
		done := make(chan error, 1)
		go func() {
			done <- readCapped(strings.NewReader("vllm:num_requests_running 1\n"), new([]byte), 100, hint)
		}()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("hint %d: readCapped = %v, want nil", hint, err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("hint %d: readCapped did not return within 5s", hint)
		}
		go func() {
			done <- readCapped(strings.NewReader(strings.Repeat("x", 200)), new([]byte), 100, hint)
		}()
		select {
		case err := <-done:
			if !errors.Is(err, ErrBodyTooLarge) {
				t.Errorf("hint %d: readCapped of 200 bytes with cap 100 = %v, want ErrBodyTooLarge", hint, err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("hint %d: readCapped did not return within 5s", hint)
		}
	}
}
