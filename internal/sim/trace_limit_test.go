package sim

import (
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"reflect"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// synthRecord is one request of a synthetic trace.
type synthRecord struct {
	ms             int64 // milliseconds after azureBase
	prompt, output int
	ids            []uint64
}

var azureBase = time.Date(2023, 11, 16, 18, 15, 46, 680590000, time.UTC)

// line returns r as a line of a trace in format.
func (r synthRecord) line(format string) string {
	if format == FormatAzure {
		return fmt.Sprintf("%s,%d,%d", azureBase.Add(time.Duration(r.ms)*time.Millisecond).Format("2006-01-02 15:04:05.0000000"), r.prompt, r.output)
	}
	ids := make([]string, len(r.ids))
	for i, id := range r.ids {
		ids[i] = strconv.FormatUint(id, 10)
	}
	return fmt.Sprintf(`{"timestamp": %d, "input_length": %d, "output_length": %d, "hash_ids": [%s]}`, r.ms, r.prompt, r.output, strings.Join(ids, ", "))
}

// randomTrace returns n records with many equal times, in no order, and
// the trace in format that lists them, with blank lines between some.
func randomTrace(rng *rand.Rand, format string, n int) ([]synthRecord, string) {
	recs := make([]synthRecord, n)
	var b strings.Builder
	if format == FormatAzure {
		b.WriteString("TIMESTAMP,ContextTokens,GeneratedTokens\n")
	}
	for i := range recs {
		r := synthRecord{ms: 250 * rng.Int64N(8), prompt: 1 + rng.IntN(2000), output: rng.IntN(40)}
		if format == FormatMooncake {
			r.ids = make([]uint64, rng.IntN((r.prompt+MooncakeBlockTokens-1)/MooncakeBlockTokens+1))
			for j := range r.ids {
				r.ids[j] = rng.Uint64N(4)
			}
		}
		recs[i] = r
		if rng.IntN(5) == 0 {
			b.WriteString("\n")
		}
		b.WriteString(r.line(format) + "\n")
	}
	return recs, b.String()
}

// wantRequests is what reading recs, the lines of a trace in format in
// trace order, with opt should return, computed as the reader has always
// done it: the lines sorted stably by time, the first opt.Requests kept,
// times from the first kept, divided by the rate scale.
func wantRequests(recs []synthRecord, format string, opt TraceOptions) []Request {
	// A line's time, in seconds from the Mooncake origin or from the
	// first Azure line.
	at := func(r synthRecord) float64 {
		if format == FormatAzure {
			return azureBase.Add(time.Duration(r.ms) * time.Millisecond).Sub(azureBase.Add(time.Duration(recs[0].ms) * time.Millisecond)).Seconds()
		}
		return float64(r.ms) / 1000
	}
	sorted := slices.Clone(recs)
	slices.SortStableFunc(sorted, func(a, b synthRecord) int {
		switch {
		case at(a) < at(b):
			return -1
		case at(a) > at(b):
			return 1
		}
		return 0
	})
	if opt.Requests > 0 && len(sorted) > opt.Requests {
		sorted = sorted[:opt.Requests]
	}
	scale := opt.RateScale
	if scale == 0 {
		scale = 1
	}
	out := make([]Request, len(sorted))
	for i, r := range sorted {
		out[i] = Request{
			Arrival:      time.Duration((at(r) - at(sorted[0])) / scale * float64(time.Second)),
			PromptTokens: r.prompt,
			OutputTokens: max(r.output, 1),
		}
		if len(r.ids) > 0 {
			out[i].BlockTokens = MooncakeBlockTokens
			var h uint64
			for _, id := range r.ids {
				h = ChainHash(h, id)
				out[i].Prefix = append(out[i].Prefix, h)
			}
		}
	}
	return out
}

// Reading a trace with a request limit returns exactly what reading it
// whole and keeping the first requests by time returns: the same lines,
// ties in trace order, the same times from the first kept and the same
// hashes, on unordered traces full of equal times in both formats.
func TestTraceLimitKeepsTheEarliest(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for iter := range 150 {
		for _, format := range []string{FormatMooncake, FormatAzure} {
			n := 1 + rng.IntN(40)
			recs, in := randomTrace(rng, format, n)
			scale := []float64{0, 1, 2.5, 0.3}[iter%4]
			all, err := ReadTrace(strings.NewReader(in), format, TraceOptions{RateScale: scale})
			if err != nil {
				t.Fatalf("%s trace %d: %v\n%s", format, iter, err, in)
			}
			for limit := range n + 2 {
				opt := TraceOptions{RateScale: scale, Requests: limit}
				got, err := ReadTrace(strings.NewReader(in), "", opt)
				if err != nil {
					t.Fatalf("%s trace %d, limit %d: %v", format, iter, limit, err)
				}
				if want := wantRequests(recs, format, opt); !reflect.DeepEqual(got, want) {
					t.Fatalf("%s trace %d, limit %d: got %+v\nwant %+v\ntrace:\n%s", format, iter, limit, got, want, in)
				}
				want := all
				if limit > 0 && limit < len(all) {
					want = all[:limit]
				}
				if !reflect.DeepEqual(got, want) {
					t.Fatalf("%s trace %d, limit %d: not the first %d of the whole trace's requests", format, iter, limit, limit)
				}
				tr, err := ScanTrace(strings.NewReader(in), format, limit)
				if err != nil {
					t.Fatalf("ScanTrace: %v", err)
				}
				if again, err := tr.Requests(scale); err != nil || !reflect.DeepEqual(again, got) {
					t.Fatalf("%s trace %d, limit %d: ScanTrace then Requests: %v, not ReadTrace's requests", format, iter, limit, err)
				}
			}
		}
	}
}

// A limit keeps the errors of every line, kept or not, in both formats,
// except an arrival too far after the first to replay, which only a kept
// line can have.
func TestTraceLimitChecksEveryLine(t *testing.T) {
	const mooncakeHead = `{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}` + "\n" +
		`{"timestamp": 10, "input_length": 5, "output_length": 5}` + "\n"
	const azureHead = "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:46.7,10,4\n"
	cases := []struct {
		name, format, in, want string
	}{
		{"mooncake bad json", FormatMooncake, mooncakeHead + "{oops\n", "line 3: not a JSON object"},
		{"mooncake late and bad", FormatMooncake, mooncakeHead + `{"timestamp": 99, "input_length": 0, "output_length": 1}`, "line 3: input_length 0 out of range"},
		{"mooncake late with a bad id", FormatMooncake, mooncakeHead + `{"timestamp": 99, "input_length": 10, "output_length": 1, "hash_ids": [1.5]}`, "line 3: hash id 1.5 is not a non-negative integer"},
		{"mooncake late with too many ids", FormatMooncake, mooncakeHead + `{"timestamp": 99, "input_length": 10, "output_length": 1, "hash_ids": [1, 2]}`, "line 3: 2 hash_ids for 10 tokens"},
		{"mooncake line too long", FormatMooncake, mooncakeHead + strings.Repeat(" ", maxLine+1) + "\n", fmt.Sprintf("line 3: longer than %d bytes", maxLine)},
		{"azure bad count", FormatAzure, azureHead + "2023-11-16 18:15:50,x,1\n", "line 4: ContextTokens"},
		{"azure too far from the first", FormatAzure, azureHead + "2123-11-16 18:15:50,1,1\n", "line 4: TIMESTAMP 2123-11-16 18:15:50 too far from the first one"},
		{"azure field count", FormatAzure, azureHead + "\n\n2023-11-16 18:15:50,1\n", "line 6: 2 fields, want 3"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for _, limit := range []int{0, 1, 2, 3} {
				_, err := ReadTrace(strings.NewReader(c.in), c.format, TraceOptions{Requests: limit})
				if !errors.Is(err, ErrMalformedTrace) || !strings.Contains(err.Error(), c.want) {
					t.Errorf("limit %d: error %v, want one holding %q", limit, err, c.want)
				}
			}
		})
	}

	// A line too far to replay is an error only if it is kept.
	far := mooncakeHead + `{"timestamp": 1e15, "input_length": 10, "output_length": 1}` + "\n"
	for limit, want := range map[int]string{0: "line 3: arrival 1e+12s after the first request exceeds 1e+09s", 3: "line 3: arrival", 2: ""} {
		reqs, err := ReadTrace(strings.NewReader(far), "", TraceOptions{Requests: limit})
		switch {
		case want == "" && (err != nil || len(reqs) != 2):
			t.Errorf("limit %d: %d requests, %v; want the first 2", limit, len(reqs), err)
		case want != "" && (!errors.Is(err, ErrMalformedTrace) || !strings.Contains(err.Error(), want)):
			t.Errorf("limit %d: error %v, want one holding %q", limit, err, want)
		}
	}
}

// synthReader produces a trace of lines synthetic requests in format, in
// no order of time, without holding it, and calls sample every step lines.
type synthReader struct {
	format      string
	lines, next int
	rng         *rand.Rand
	buf         []byte
	step        int
	sample      func()
}

func (s *synthReader) Read(p []byte) (int, error) {
	for len(s.buf) == 0 {
		if s.next == s.lines {
			return 0, io.EOF
		}
		if s.next == 0 && s.format == FormatAzure {
			s.buf = append(s.buf, "TIMESTAMP,ContextTokens,GeneratedTokens\n"...)
		}
		if s.next%s.step == 0 {
			s.sample()
		}
		r := synthRecord{ms: s.rng.Int64N(3_600_000), prompt: 2*MooncakeBlockTokens + s.rng.IntN(4000), output: s.rng.IntN(500)}
		if s.format == FormatMooncake {
			r.ids = []uint64{s.rng.Uint64N(100), s.rng.Uint64N(100)}
		}
		s.buf = append(s.buf, r.line(s.format)+"\n"...)
		s.next++
	}
	n := copy(p, s.buf)
	s.buf = s.buf[n:]
	return n, nil
}

// liveHeap returns the bytes of live heap objects.
func liveHeap() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// Reading a long trace with a small request limit holds the requests it
// keeps, not the trace: 100,000 lines (4-10 MB of text) in no order of
// time and a limit of 10 keep the live heap within 1 MiB of where it
// started all through the reading. (It grows by some 40 kB; holding every
// line, as the reader did, took 5-7 MB.)
func TestTraceLimitBoundsMemory(t *testing.T) {
	const lines, limit, bound = 100_000, 10, 1 << 20
	for _, format := range []string{FormatMooncake, FormatAzure} {
		t.Run(format, func(t *testing.T) {
			base := liveHeap()
			var peak uint64
			in := &synthReader{format: format, lines: lines, rng: rand.New(rand.NewPCG(3, 4)), step: lines / 10,
				sample: func() { peak = max(peak, liveHeap()) }}
			reqs, err := ReadTrace(in, format, TraceOptions{Requests: limit})
			if err != nil {
				t.Fatal(err)
			}
			peak = max(peak, liveHeap())
			if len(reqs) != limit {
				t.Fatalf("%d requests, want %d", len(reqs), limit)
			}
			if grew := int64(peak) - int64(base); grew > bound {
				t.Errorf("live heap grew by %d bytes reading %d lines with a limit of %d, want at most %d", grew, lines, limit, bound)
			}
			runtime.KeepAlive(reqs)
		})
	}
}

// BenchmarkScanTrace reads a synthetic trace in no order of time with a
// limit, as llmlb-sim -trace does with -requests.
func BenchmarkScanTrace(b *testing.B) {
	const lines, limit = 100_000, 1000
	for _, format := range []string{FormatMooncake, FormatAzure} {
		b.Run(fmt.Sprintf("format=%s/lines=%d/requests=%d", format, lines, limit), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				in := &synthReader{format: format, lines: lines, rng: rand.New(rand.NewPCG(3, 4)), step: lines, sample: func() {}}
				if _, err := ScanTrace(in, format, limit); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(lines*b.N)/b.Elapsed().Seconds(), "lines/s")
		})
	}
}
