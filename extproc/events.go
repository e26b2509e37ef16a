package extproc

// eventScanner finds the first event of a server-sent event stream: the
// start of a line that begins with "data:", which a comment or keep-alive
// (": ping") or an event name line is not. It reads the stream in pieces
// of any size and keeps no more than its position in the current line.
// Its zero value is at the start of a stream.
type eventScanner struct {
	n int // bytes of "data:" matched at the start of the current line; -1: the line cannot match
}

// feed scans the next piece of the stream and reports whether a "data:"
// line has started.
func (e *eventScanner) feed(p []byte) bool {
	const field = "data:"
	for _, c := range p {
		switch {
		case c == '\n' || c == '\r':
			e.n = 0
		case e.n < 0:
		case c == field[e.n]:
			e.n++
			if e.n == len(field) {
				return true
			}
		default:
			e.n = -1
		}
	}
	return false
}
