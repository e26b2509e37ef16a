package sim

import (
	"fmt"
	"slices"
)

// earliest keeps the limit earliest of the trace lines added to it, or all
// of them if limit is 0: the lines that sorting every line stably by time
// and keeping the first limit would keep. Lines are added in trace order,
// so the line number breaks ties as the stable sort does. With a limit,
// lines is a max-heap on (at, line), its root the latest line kept, and
// each line added costs O(log limit).
type earliest struct {
	limit int
	lines []traceLine
}

// admits reports whether a line arriving at at, read after every line
// added so far, would be kept: always while fewer than limit are kept,
// else only if it arrives strictly before the latest line kept, since a
// tie goes to the line read first.
func (e *earliest) admits(at float64) bool {
	return e.limit == 0 || len(e.lines) < e.limit || at < e.lines[0].at
}

// add keeps l, which admits accepted, in place of the latest line kept if
// limit lines are kept already.
func (e *earliest) add(l traceLine) {
	switch {
	case e.limit == 0:
		e.lines = append(e.lines, l)
	case len(e.lines) < e.limit:
		e.lines = append(e.lines, l)
		e.up(len(e.lines) - 1)
	default:
		e.lines[0] = l
		e.down(0)
	}
}

// later reports whether line i of the heap comes after line j.
func (e *earliest) later(i, j int) bool {
	a, b := &e.lines[i], &e.lines[j]
	return a.at > b.at || (a.at == b.at && a.line > b.line)
}

func (e *earliest) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !e.later(i, p) {
			return
		}
		e.lines[i], e.lines[p] = e.lines[p], e.lines[i]
		i = p
	}
}

func (e *earliest) down(i int) {
	n := len(e.lines)
	for {
		c := 2*i + 1
		if c >= n {
			return
		}
		if c+1 < n && e.later(c+1, c) {
			c++
		}
		if !e.later(c, i) {
			return
		}
		e.lines[i], e.lines[c] = e.lines[c], e.lines[i]
		i = c
	}
}

// trace returns the lines kept, by time, ties in trace order, as a Trace
// of blockTokens tokens per hash id, or an error if there are none.
func (e *earliest) trace(blockTokens int) (*Trace, error) {
	if len(e.lines) == 0 {
		return nil, fmt.Errorf("%w: no requests", ErrMalformedTrace)
	}
	// Line numbers are distinct, so this order is total and equals a
	// stable sort by time of the lines in trace order.
	slices.SortFunc(e.lines, func(a, b traceLine) int {
		switch {
		case a.at < b.at:
			return -1
		case a.at > b.at:
			return 1
		case a.line < b.line:
			return -1
		case a.line > b.line:
			return 1
		}
		return 0
	})
	return &Trace{lines: e.lines, blockTokens: blockTokens}, nil
}
