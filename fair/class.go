package fair

import "strings"

// Class is a priority class. A smaller Class is more urgent; the zero value
// is [Standard]. Values beyond the named ones count as the nearest named
// one (below Interactive as Interactive, above Batch as Batch). It is a
// plain value, safe to use from any goroutine.
type Class int8

// The priority classes, most urgent first.
const (
	// Interactive is a request a user is waiting on: a chat turn, or an
	// agent step whose result is shown at once.
	Interactive Class = -1
	// Standard is the default class.
	Standard Class = 0
	// Batch is background work: offline evaluation, summarisation jobs,
	// an agent's asynchronous steps. It is shed first.
	Batch Class = 1
)

// numClasses is the number of ranks; rank 0 is the most urgent.
const numClasses = int(Batch-Interactive) + 1

// rank returns c's rank, from 0 (Interactive) to numClasses-1 (Batch).
func (c Class) rank() int {
	switch {
	case c < Interactive:
		return 0
	case c > Batch:
		return numClasses - 1
	}
	return int(c - Interactive)
}

// classOf returns the class of rank.
func classOf(rank int) Class { return Interactive + Class(rank) }

// String returns "interactive", "standard" or "batch".
func (c Class) String() string {
	switch c.rank() {
	case 0:
		return "interactive"
	case 1:
		return "standard"
	}
	return "batch"
}

// ParseClass returns the class named s ("interactive", "standard" or
// "batch", in any case, with surrounding spaces ignored) and reports whether
// s names one. For anything else it returns [Standard] and false.
func ParseClass(s string) (Class, bool) {
	s = strings.TrimSpace(s)
	switch {
	case strings.EqualFold(s, "interactive"):
		return Interactive, true
	case strings.EqualFold(s, "standard"):
		return Standard, true
	case strings.EqualFold(s, "batch"):
		return Batch, true
	}
	return Standard, false
}
