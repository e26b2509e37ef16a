package sim

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/llmlb/llmlb/internal/lru"
)

// Trace formats accepted by [ReadTrace].
const (
	FormatMooncake = "mooncake"
	FormatAzure    = "azure"
)

// MooncakeBlockTokens is the number of prompt tokens per hash id in Mooncake
// traces.
const MooncakeBlockTokens = 512

// maxTraceSeconds bounds the scaled span of a trace (about 30 years), so
// arrival times cannot overflow.
const maxTraceSeconds = 1e9

// maxLine bounds one trace line.
const maxLine = 4 << 20

// TraceOptions controls how a trace is turned into requests. The zero value
// replays the whole trace at its own rate.
type TraceOptions struct {
	// RateScale multiplies the arrival rate: inter-arrival times are divided
	// by it. 0 means 1.
	RateScale float64
	// Requests keeps only the first Requests requests by arrival, lines
	// of equal time in their order in the trace; 0 keeps all. Reading then
	// holds at most Requests requests, however long the trace: every line
	// is still read and checked, so a malformed line anywhere is still an
	// error, but only the earliest Requests are kept.
	Requests int
}

func (o *TraceOptions) normalize() error {
	if o.RateScale == 0 {
		o.RateScale = 1
	}
	if !(o.RateScale > 0) || math.IsInf(o.RateScale, 0) {
		return fmt.Errorf("%w: rate scale %v, want a positive number", ErrInvalidConfig, o.RateScale)
	}
	if o.Requests < 0 {
		return fmt.Errorf("%w: request cap %d is negative", ErrInvalidConfig, o.Requests)
	}
	return nil
}

// ReadTrace reads a trace in the given format; an empty format is detected
// from the content: a line starting with '{' is Mooncake JSONL, anything
// else Azure CSV. In either format a UTF-8 byte-order mark is skipped, and
// lines need not be in time order: the requests are sorted by arrival
// (stably), the first arriving at 0. It is [ScanTrace] followed by
// [Trace.Requests].
func ReadTrace(r io.Reader, format string, opt TraceOptions) ([]Request, error) {
	br := bufio.NewReader(r)
	if format == "" {
		head, _ := br.Peek(64)
		format = DetectFormat(head)
	}
	switch format {
	case FormatMooncake:
		return ReadMooncake(br, opt)
	case FormatAzure:
		return ReadAzure(br, opt)
	}
	return nil, unknownFormat(format)
}

func unknownFormat(format string) error {
	return fmt.Errorf("%w: unknown trace format %q (want %s or %s)", ErrInvalidConfig, format, FormatMooncake, FormatAzure)
}

// A Trace is the arrivals read from a trace, kept in arrival order, before
// they are turned into requests: [ScanTrace] reads a trace once, and
// [Trace.Requests] replays it at any rate scale. A zero Trace holds no
// arrival and is not ready to use. A Trace is not modified once read, so
// its methods may be called from several goroutines at once.
type Trace struct {
	lines       []traceLine // by arrival, lines of equal time in trace order
	blockTokens int         // tokens per hash id
}

// ScanTrace reads a trace in format ("" detects it, as [ReadTrace] does)
// and keeps its first requests arrivals, or all of them if requests is 0,
// exactly those that [ReadTrace] with [TraceOptions.Requests] set to
// requests turns into requests. It checks every line as ReadTrace does, but
// holds only the arrivals it keeps: with a limit, its memory is bounded by
// the limit, not by the trace, and each line costs O(log requests) time
// beyond its parsing.
func ScanTrace(r io.Reader, format string, requests int) (*Trace, error) {
	if requests < 0 {
		return nil, fmt.Errorf("%w: request cap %d is negative", ErrInvalidConfig, requests)
	}
	br := bufio.NewReader(r)
	if format == "" {
		head, _ := br.Peek(64)
		format = DetectFormat(head)
	}
	switch format {
	case FormatMooncake:
		return scanMooncake(br, requests)
	case FormatAzure:
		return scanAzure(br, requests)
	}
	return nil, unknownFormat(format)
}

// DetectFormat returns the format of a trace that starts with head, as
// [ReadTrace] detects it: [FormatMooncake] if its first character other
// than white space or a byte-order mark is '{', else [FormatAzure].
func DetectFormat(head []byte) string {
	if t := bytes.TrimLeft(head, " \t\r\n\ufeff"); len(t) > 0 && t[0] == '{' {
		return FormatMooncake
	}
	return FormatAzure
}

// traceLine is one arrival read from a trace, before scaling.
type traceLine struct {
	line   int
	at     float64 // seconds, relative to an arbitrary origin
	prompt int
	output int
	ids    []uint64
}

type mooncakeRecord struct {
	Timestamp    *float64  `json:"timestamp"`
	InputLength  *int64    `json:"input_length"`
	OutputLength *int64    `json:"output_length"`
	HashIDs      []float64 `json:"hash_ids"`
}

// ReadMooncake reads a Mooncake JSONL trace: one object per line with
// timestamp (milliseconds), input_length, output_length and hash_ids, the
// ids of the prompt's 512-token blocks (equal id, same block content). Block
// i of a request gets the chained hash ChainHash(hash of block i-1,
// hash_ids[i]), so a cache hit requires the whole prefix to match. An output
// length of 0 is replayed as 1. Blank lines are skipped; any other malformed
// line is an error wrapping [ErrMalformedTrace] that names it, as is an
// input_length beyond [MaxPromptTokens] or an output_length beyond
// [MaxOutputTokens].
func ReadMooncake(r io.Reader, opt TraceOptions) ([]Request, error) {
	if err := opt.normalize(); err != nil {
		return nil, err
	}
	t, err := scanMooncake(r, opt.Requests)
	if err != nil {
		return nil, err
	}
	return t.Requests(opt.RateScale)
}

// scanMooncake reads a Mooncake trace as ReadMooncake does and keeps its
// first limit arrivals (0 keeps all).
func scanMooncake(r io.Reader, limit int) (*Trace, error) {
	sel := earliest{limit: limit}
	err := scanLines(r, func(n int, line []byte) error {
		var rec mooncakeRecord
		if err := json.Unmarshal(line, &rec); err != nil {
			return fmt.Errorf("%w: line %d: %s", ErrMalformedTrace, n, jsonProblem(err))
		}
		switch {
		case rec.Timestamp == nil || rec.InputLength == nil || rec.OutputLength == nil:
			return fmt.Errorf("%w: line %d: want timestamp, input_length and output_length", ErrMalformedTrace, n)
		case math.IsNaN(*rec.Timestamp) || math.IsInf(*rec.Timestamp, 0) || *rec.Timestamp < 0 || *rec.Timestamp > 1e15:
			return fmt.Errorf("%w: line %d: timestamp %v out of range", ErrMalformedTrace, n, *rec.Timestamp)
		case *rec.InputLength < 1 || *rec.InputLength > MaxPromptTokens:
			return fmt.Errorf("%w: line %d: input_length %d out of range [1, %d]", ErrMalformedTrace, n, *rec.InputLength, MaxPromptTokens)
		case *rec.OutputLength < 0 || *rec.OutputLength > MaxOutputTokens:
			return fmt.Errorf("%w: line %d: output_length %d out of range [0, %d]", ErrMalformedTrace, n, *rec.OutputLength, MaxOutputTokens)
		}
		prompt := int(*rec.InputLength)
		nb := (prompt + MooncakeBlockTokens - 1) / MooncakeBlockTokens
		if len(rec.HashIDs) > nb {
			return fmt.Errorf("%w: line %d: %d hash_ids for %d tokens (at most %d)", ErrMalformedTrace, n, len(rec.HashIDs), prompt, nb)
		}
		at := *rec.Timestamp / 1000
		keep := sel.admits(at)
		var ids []uint64
		if keep {
			ids = make([]uint64, len(rec.HashIDs))
		}
		for i, id := range rec.HashIDs {
			if id < 0 || id != math.Trunc(id) || id >= 1<<53 {
				return fmt.Errorf("%w: line %d: hash id %v is not a non-negative integer", ErrMalformedTrace, n, id)
			}
			if keep {
				ids[i] = uint64(id)
			}
		}
		if keep {
			sel.add(traceLine{line: n, at: at, prompt: prompt, output: max(int(*rec.OutputLength), 1), ids: ids})
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return sel.trace(MooncakeBlockTokens)
}

// azureLayout is the TIMESTAMP format of the Azure LLM inference traces.
const azureLayout = "2006-01-02 15:04:05.999999999"

// ReadAzure reads an Azure LLM inference trace: a CSV header naming
// TIMESTAMP, ContextTokens and GeneratedTokens (in any order), then one
// request per line, timestamps in the form 2023-11-16 18:15:46.6805900. The
// trace has no prefix information, so its requests share nothing. A
// GeneratedTokens of 0 is replayed as 1. A malformed line, a ContextTokens
// beyond [MaxPromptTokens] or a GeneratedTokens beyond [MaxOutputTokens] is
// an error wrapping [ErrMalformedTrace] that names the line.
func ReadAzure(r io.Reader, opt TraceOptions) ([]Request, error) {
	if err := opt.normalize(); err != nil {
		return nil, err
	}
	t, err := scanAzure(r, opt.Requests)
	if err != nil {
		return nil, err
	}
	return t.Requests(opt.RateScale)
}

// scanAzure reads an Azure trace as ReadAzure does and keeps its first
// limit arrivals (0 keeps all). Times are relative to the first line's,
// whether or not that line is kept.
func scanAzure(r io.Reader, limit int) (*Trace, error) {
	sel := earliest{limit: limit}
	cols := map[string]int{}
	var ts, ctx, gen int
	width := 0
	var origin time.Time
	hasOrigin := false // the first request's time, which may be the zero time
	err := scanLines(r, func(n int, line []byte) error {
		fields := strings.Split(strings.TrimSpace(string(line)), ",")
		if width == 0 {
			for i, f := range fields {
				name := strings.TrimSpace(f)
				if _, dup := cols[name]; dup && (name == "TIMESTAMP" || name == "ContextTokens" || name == "GeneratedTokens") {
					return fmt.Errorf("%w: line %d: header names %s twice", ErrMalformedTrace, n, name)
				}
				cols[name] = i
			}
			var ok1, ok2, ok3 bool
			ts, ok1 = cols["TIMESTAMP"]
			ctx, ok2 = cols["ContextTokens"]
			gen, ok3 = cols["GeneratedTokens"]
			if !ok1 || !ok2 || !ok3 {
				return fmt.Errorf("%w: line %d: header must name TIMESTAMP, ContextTokens and GeneratedTokens", ErrMalformedTrace, n)
			}
			width = len(fields)
			return nil
		}
		if len(fields) != width {
			return fmt.Errorf("%w: line %d: %d fields, want %d", ErrMalformedTrace, n, len(fields), width)
		}
		t, err := time.Parse(azureLayout, strings.TrimSpace(fields[ts]))
		if err != nil {
			return fmt.Errorf("%w: line %d: TIMESTAMP %q, want a time such as 2023-11-16 18:15:46.6805900", ErrMalformedTrace, n, fields[ts])
		}
		prompt, err := strconv.Atoi(strings.TrimSpace(fields[ctx]))
		if err != nil || prompt < 1 || prompt > MaxPromptTokens {
			return fmt.Errorf("%w: line %d: ContextTokens %q, want an integer in [1, %d]", ErrMalformedTrace, n, fields[ctx], MaxPromptTokens)
		}
		output, err := strconv.Atoi(strings.TrimSpace(fields[gen]))
		if err != nil || output < 0 || output > MaxOutputTokens {
			return fmt.Errorf("%w: line %d: GeneratedTokens %q, want an integer in [0, %d]", ErrMalformedTrace, n, fields[gen], MaxOutputTokens)
		}
		if !hasOrigin {
			origin, hasOrigin = t, true
		}
		d := t.Sub(origin).Seconds()
		if math.Abs(d) > 1e9 {
			return fmt.Errorf("%w: line %d: TIMESTAMP %s too far from the first one", ErrMalformedTrace, n, fields[ts])
		}
		if sel.admits(d) {
			sel.add(traceLine{line: n, at: d, prompt: prompt, output: max(output, 1)})
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if width == 0 {
		return nil, fmt.Errorf("%w: empty trace", ErrMalformedTrace)
	}
	return sel.trace(0)
}

// scanLines calls f with each non-blank line and its 1-based number, the
// first without the UTF-8 byte-order mark it may start with.
func scanLines(r io.Reader, f func(n int, line []byte) error) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), maxLine)
	n := 0
	for sc.Scan() {
		n++
		line := sc.Bytes()
		if n == 1 {
			line = bytes.TrimPrefix(line, []byte("\ufeff"))
		}
		line = bytes.TrimSpace(line)
		if len(line) == 0 {
			continue
		}
		if err := f(n, line); err != nil {
			return err
		}
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return fmt.Errorf("%w: line %d: longer than %d bytes", ErrMalformedTrace, n+1, maxLine)
		}
		return fmt.Errorf("%w: line %d: %v", ErrMalformedTrace, n+1, err)
	}
	return nil
}

// Requests returns the trace's arrivals as requests, rate scaled by
// rateScale (0 means 1): the first arrives at 0, inter-arrival times are
// divided by rateScale, and block i of a request with hash ids gets the
// chained hash ChainHash(hash of block i-1, id i). Each call returns new
// requests. An arrival scaled beyond about 30 years after the first is an
// error wrapping [ErrMalformedTrace] that names its line.
func (t *Trace) Requests(rateScale float64) ([]Request, error) {
	opt := TraceOptions{RateScale: rateScale}
	if err := opt.normalize(); err != nil {
		return nil, err
	}
	out := make([]Request, len(t.lines))
	t0 := t.lines[0].at
	for i, l := range t.lines {
		at := (l.at - t0) / opt.RateScale
		if at > maxTraceSeconds {
			return nil, fmt.Errorf("%w: line %d: arrival %.3gs after the first request exceeds %gs", ErrMalformedTrace, l.line, at, float64(maxTraceSeconds))
		}
		req := Request{
			Arrival:      time.Duration(at * float64(time.Second)),
			PromptTokens: l.prompt,
			OutputTokens: l.output,
		}
		if len(l.ids) > 0 {
			req.BlockTokens = t.blockTokens
			req.Prefix = make([]uint64, len(l.ids))
			var h uint64
			for j, id := range l.ids {
				h = ChainHash(h, id)
				req.Prefix[j] = h
			}
		}
		out[i] = req
	}
	return out, nil
}

// PooledCacheHitRate returns the prefix hit rate that one LRU cache of
// tokens tokens, shared by all replicas, would reach on reqs: each request's
// blocks, in order, hit while they are cached and are then cached as the
// most recently used, evicting the least recently used, and its Reply
// blocks are cached after them. With tokens the cluster's total KV
// capacity, it shows how much of [InfiniteCacheHitRate] finite caches can
// reach at all; it is a reference rather than a strict bound, since LRU is
// not the best eviction order. It returns 0 when tokens
// holds no block.
func PooledCacheHitRate(reqs []Request, tokens int) float64 {
	var cache *lru.LRU
	var hit, total int64
	for i := range reqs {
		r := &reqs[i]
		total += int64(r.PromptTokens)
		if len(r.Prefix) == 0 || r.BlockTokens < 1 {
			continue // shares nothing, or invalid: counts as a miss
		}
		if cache == nil {
			n := tokens / r.BlockTokens
			if n < 1 {
				return 0
			}
			cache = lru.New(n, nil)
		}
		for j, h := range r.Prefix {
			n := min(r.BlockTokens, r.PromptTokens-j*r.BlockTokens)
			if n <= 0 {
				break
			}
			if _, ok := cache.Get(h); ok {
				hit += int64(n)
			} else {
				cache.Add(h, 0)
			}
		}
		for _, h := range r.Reply {
			cache.Add(h, 0)
		}
	}
	if total == 0 {
		return 0
	}
	return float64(hit) / float64(total)
}

// InfiniteCacheHitRate returns the prefix hit rate an infinite cache shared
// by all replicas would reach on reqs: the token-weighted share of prompt
// blocks whose chained hash appeared in an earlier request's prompt or
// Reply. No policy can exceed it.
func InfiniteCacheHitRate(reqs []Request) float64 {
	var seen hashSet
	var hit, total int64
	for i := range reqs {
		r := &reqs[i]
		total += int64(r.PromptTokens)
		seen.warm(r.Prefix)
		seen.warm(r.Reply)
		for j, h := range r.Prefix {
			tokens := min(r.BlockTokens, r.PromptTokens-j*r.BlockTokens)
			if tokens <= 0 {
				break
			}
			if !seen.add(h) {
				hit += int64(tokens)
			}
		}
		for _, h := range r.Reply {
			seen.add(h)
		}
	}
	if total == 0 {
		return 0
	}
	return float64(hit) / float64(total)
}

// jsonProblem says what is wrong with a trace line that err, from
// json.Unmarshal, refused, in the trace's terms: a field of the wrong kind
// is named as the trace names it, not by the Go type that reads it.
func jsonProblem(err error) string {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) && te.Field != "" {
		want := "a number"
		switch te.Type.Kind() {
		case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
			reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
			want = "an integer"
		case reflect.Slice, reflect.Array:
			want = "an array of integers"
		case reflect.Float32, reflect.Float64:
			if strings.HasPrefix(te.Value, "number") { // such as 1e400
				return fmt.Sprintf("%s: %s is out of range", te.Field, te.Value)
			}
		}
		return fmt.Sprintf("%s: want %s, not %s %s", te.Field, want, article(te.Value), te.Value)
	}
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return fmt.Sprintf("not a JSON object (%v at byte %d)", se, se.Offset)
	}
	return "not a JSON object of the trace's fields"
}

// article returns the indefinite article of the JSON kind word w.
func article(w string) string {
	if w != "" && strings.ContainsRune("aeiou", rune(w[0])) {
		return "an"
	}
	return "a"
}
