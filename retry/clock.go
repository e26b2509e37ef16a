package retry

import "time"

// Clock tells the time. The budgets, the ejector and the loop read it; tests
// and simulators pass a fake one. *llmlb's clocks satisfy it. Now is called
// from concurrent goroutines and must be safe for that.
type Clock interface {
	Now() time.Time
}

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

func clockOr(c Clock) Clock {
	if c == nil {
		return systemClock{}
	}
	return c
}
