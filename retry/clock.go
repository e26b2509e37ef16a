package retry

import (
	"time"

	"github.com/llmlb/llmlb"
)

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

func clockOr(c llmlb.Clock) llmlb.Clock {
	if c == nil {
		return systemClock{}
	}
	return c
}
