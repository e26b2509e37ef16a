package signals

import (
	"bytes"
	"fmt"
	"slices"
	"strings"
)

// An engine exposition is mostly histogram buckets and process metrics that
// no profile reads (a vLLM /metrics body has ~200 samples, ~15 of them
// used), and expfmt's text parser spends its time allocating a protobuf
// message per sample. filter therefore keeps only the lines that name a
// metric some profile reads (HELP, TYPE and sample lines) before the body
// goes to the parser; the parser still parses every line it is given. A line
// that cannot start a sample or a comment (HTML, JSON, binary) fails the whole
// body, as it would in the parser.

// wanted holds, per engine, the metric names its profile reads (every
// profile's for EngineAuto), with and without a counter's _total suffix.
var wanted = func() [numEngines]map[string]bool {
	var w [numEngines]map[string]bool
	for e := range w {
		w[e] = make(map[string]bool)
	}
	for e, p := range profiles {
		if p == nil {
			continue
		}
		all := []series{p.running, p.waiting, p.scheduled, p.preempt, {name: p.lora}}
		all = slices.Concat(all, p.kv, p.prefixQ, p.prefixHit, p.awake)
		for _, c := range p.caps {
			all = append(all, c.blocks, c.blockSize)
		}
		for _, q := range p.queued {
			all = append(all, q...)
		}
		for _, s := range all {
			if s.name == "" {
				continue
			}
			for _, name := range []string{s.name, strings.TrimSuffix(s.name, "_total")} {
				w[e][name] = true
				w[EngineAuto][name] = true
			}
		}
	}
	return w
}()

// filter compacts b in place to the lines naming a wanted metric and returns
// the result, with the line number in b of each line kept appended to lines.
func filter(b []byte, want map[string]bool, lines []int) ([]byte, []int, error) {
	out := b[:0]
	work := 0    // the sum of the squares of the label counts of the kept sample lines above freeLabels
	samples := 0 // the kept sample lines
	all := 0     // their labels
	for n, rest := 1, b; len(rest) > 0; n++ {
		line := rest
		if i := bytes.IndexByte(rest, '\n'); i >= 0 {
			line, rest = rest[:i+1], rest[i+1:]
		} else {
			rest = nil
		}
		name, quoted, err := lineName(line)
		if err != nil {
			return nil, lines, fmt.Errorf("%w: line %d: %v", ErrParse, n, err)
		}
		if !quoted && (name == nil || !want[string(name)]) {
			continue
		}
		if !comment(line) {
			if samples++; samples > maxSeries {
				return nil, lines, fmt.Errorf("%w: line %d: more than %d series in the metrics read", ErrParse, n, maxSeries)
			}
			k := labels(line)
			if k > freeLabels {
				if work += k * k; work > maxLabelWork {
					return nil, lines, fmt.Errorf("%w: line %d: too many labels (%d on the line)", ErrParse, n, k)
				}
			}
			if all += k; all > maxLabels {
				return nil, lines, fmt.Errorf("%w: line %d: more than %d labels in the metrics read", ErrParse, n, maxLabels)
			}
		}
		// out never overtakes line: both advance through b and out only by
		// lines already passed.
		out = append(out, line...)
		if line[len(line)-1] != '\n' {
			out = append(out, '\n')
		}
		lines = append(lines, n)
	}
	return out, lines, nil
}

// lineName returns the metric a line is about: a sample's name, or the name
// in a HELP or TYPE comment. It returns nil for blank lines and other
// comments, quoted for a sample whose name is quoted inside its braces (left
// to the parser), and an error for a line that cannot start a sample or a
// comment.
func lineName(line []byte) (name []byte, quoted bool, err error) {
	line = bytes.TrimLeft(line, " \t")
	if len(line) == 0 || line[0] == '\n' || line[0] == '\r' {
		return nil, false, nil
	}
	c := line[0]
	switch {
	case c == '#':
		rest := bytes.TrimLeft(line[1:], " \t")
		var ok bool
		if rest, ok = bytes.CutPrefix(rest, []byte("HELP")); !ok {
			if rest, ok = bytes.CutPrefix(rest, []byte("TYPE")); !ok {
				return nil, false, nil
			}
		}
		rest = bytes.TrimLeft(rest, " \t")
		return rest[:nameEnd(rest)], false, nil
	case c == '{':
		return nil, true, nil
	case c == '_' || c == ':' || (c|0x20 >= 'a' && c|0x20 <= 'z'):
		return line[:nameEnd(line)], false, nil
	}
	return nil, false, fmt.Errorf("%q does not start a sample or a comment", truncate(string(line)))
}

// nameEnd returns the length of the metric name at the start of b.
func nameEnd(b []byte) int {
	for i, c := range b {
		if c == '{' || c == ' ' || c == '\t' || c == '\n' || c == '\r' {
			return i
		}
	}
	return len(b)
}

// maxLabelWork bounds the sum, over the sample lines that go to the parser,
// of the square of each line's number of labels. The parser's cost grows
// with that square (it checks each new label of a line against all the
// previous ones: a single 64 KiB line of labels took it 3.5 s, a 4 MiB one
// hours, a 4 MiB body of 128-label lines 7 s), so the sum bounds its cost at
// about that of a body of short lines. An engine's exposition is far below it: its
// widest series, vllm:cache_config_info, has about 30 labels (900), and
// vllm:lora_requests_info's series 3 or 4.
const maxLabelWork = 1 << 20

// freeLabels is the number of labels up to which a line is not counted in
// maxLabelWork: the parser's work on it is within a small factor of its
// length.
const freeLabels = 16

// maxLabels bounds the labels of the sample lines that go to the parser,
// in all: each costs it allocations of a few hundred bytes (a label pair,
// and a set of the line's labels so far once a line has more than 8), for
// as little as five bytes of text, so that a 4 MiB body of lines of 8 to
// 16 labels, each under freeLabels and all within maxSeries, made it
// allocate 117 to 330 MB. Two labels per series of maxSeries fit, and an
// engine's exposition of the metrics read has a few series of one to four
// labels.
const maxLabels = 2 * maxSeries

// comment reports whether line is a comment (HELP, TYPE, or other).
func comment(line []byte) bool {
	line = bytes.TrimLeft(line, " \t")
	return len(line) > 0 && line[0] == '#'
}

// labels returns the number of labels of a sample line: its '=' signs
// outside quoted strings, one per label.
func labels(line []byte) int {
	n := 0
	inQuote, escaped := false, false
	for _, c := range line {
		switch {
		case escaped:
			escaped = false
		case inQuote && c == '\\':
			escaped = true
		case c == '"':
			inQuote = !inQuote
		case !inQuote && c == '=':
			n++
		}
	}
	return n
}
