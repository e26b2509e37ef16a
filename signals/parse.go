package signals

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"mime"
	"net/http"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/llmlb/llmlb"
)

// Observation is one engine observation with the extras a scrape can carry
// beyond [llmlb.Load].
type Observation struct {
	llmlb.Load
	// Engine is the dialect the observation was read in (the detected one
	// when parsing with EngineAuto); EngineAuto for pushed loads (an ORCA
	// report recorded over a scrape keeps the scrape's).
	Engine Engine
	// Preemptions is the engine's cumulative count of preempted requests
	// (vllm:num_preemptions_total); a rising rate means the engine is
	// evicting work to make room. NaN when not reported.
	Preemptions float64
	// PrefixQueries and PrefixHits are the engine's cumulative prefix-cache
	// lookups and hits, in tokens (vllm:prefix_cache_queries_total and
	// vllm:prefix_cache_hits_total, or vllm:gpu_prefix_cache_queries_total
	// and vllm:gpu_prefix_cache_hits_total before vLLM 0.9); their rates
	// give the measured hit rate. NaN when not reported.
	PrefixQueries float64
	PrefixHits    float64
	// Asleep reports whether the engine said it is asleep: put to sleep
	// (vLLM's POST /sleep or LLM.sleep, at any level) and not woken since,
	// as vLLM exports it in vllm:engine_fully_awake or, where that is
	// absent, vllm:engine_sleep_state{sleep_state="awake"} (0 on every
	// engine index). The older gauge reads awake after a partial wake-up
	// (wake_up with tags=["weights"]), though the KV cache is still
	// released: see the package documentation. A sleeping engine runs and
	// queues nothing, so its counts read as the idlest replica's, yet it serves
	// nothing: the requests it is sent wait until it wakes (since
	// vllm-project/vllm#34528, sleep pauses the scheduler; before, the
	// engine crashed on them, #15483). False for engines that do not
	// export the state and for pushed loads; an ORCA report recorded over
	// a scrape keeps the scrape's.
	Asleep bool
}

// observationOf wraps a pushed load: the extras are not reported.
func observationOf(l llmlb.Load) Observation {
	nan := math.NaN()
	return Observation{Load: l, Preemptions: nan, PrefixQueries: nan, PrefixHits: nan}
}

// Parse reads one metrics exposition from r and maps it to an observation
// with the engine's profile; [EngineAuto] detects the engine from the metric
// names. contentType is the response's Content-Type: the Prometheus text
// format (text/plain, also assumed when empty), OpenMetrics
// (application/openmetrics-text; see the note above) and delimited protobuf
// are read with prometheus/common/expfmt; anything else, such as text/html,
// is an error wrapping [ErrParse].
//
// Counts summed over several series (one per model or data-parallel rank) are
// added up; KV usage fractions and block sizes are averaged. Copies of one
// value count once, the largest: SGLang's schedulers of one data-parallel
// rank (series that differ only in tp_rank, pp_rank and moe_ep_rank, as
// --enable-metrics-for-all-schedulers exports them) report the same batch,
// and vLLM 0.9 and 0.10 with several API servers export
// vllm:kv_cache_usage_perc once per process (label pid), as trtllm-serve
// does every gauge; a vLLM server with several data-parallel engines
// exports its KV capacity, the sum over them, once per engine. SGLang's per-priority request counts are left out for
// their total (priority=""), its prefill/decode disaggregation queues wait
// with its waiting queue, and TensorRT-LLM's running requests are the
// scheduled ones.
// The package documentation lists the metrics read. The running and waiting counts
// are required ([ErrMissingMetric] if absent); KV usage is NaN and the KV
// capacity 0 when not reported. A NaN, infinite, negative or implausibly
// large value is an error wrapping [ErrInvalidValue] naming the metric, and
// two series of one metric with the same labels an error wrapping
// [ErrParse]. More prefix-cache hits than queries, which no engine counts
// (a read racing a write of several API servers' metrics), reports
// neither.
//
// Only the lines naming a metric some profile reads go to the parser (a vLLM
// body is mostly histogram buckets, which would dominate the cost); every
// other line must still look like a sample or a comment. OpenMetrics is read
// with expfmt's text parser, not its OpenMetrics decoder: in
// prometheus/common v0.74 that decoder's cost grows faster than linearly with
// its input (seconds of CPU for a 25 KiB vLLM exposition), unusable on a
// scrape loop. The text parser reads what client libraries emit as
// OpenMetrics (_total and _created samples, UNIT comments, the EOF marker);
// OpenMetrics-only syntax on a line that is read (exemplars, stateset types,
// fractional timestamps) fails with [ErrParse]. Delimited protobuf is decoded
// with no message allowed to be longer than the body, and only the families
// some profile reads are decoded (the others must still be well-formed).
//
// The metrics read may hold 65536 series in all; a body with more of them
// (in any format) fails with [ErrParse] before they are parsed, as no
// engine exposes that many. Parse reads all of r; bound it (the [Scraper]
// caps the body). The returned observation's At is zero: the caller stamps
// it.
func Parse(r io.Reader, contentType string, engine Engine) (Observation, error) {
	format, err := formatOf(contentType)
	if err != nil {
		return Observation{}, err
	}
	b, err := io.ReadAll(r)
	if err != nil {
		return Observation{}, fmt.Errorf("%w: reading: %v", ErrParse, err)
	}
	return parse(b, format, engine)
}

// parseBody is Parse for a body the caller owns: a text body is filtered in
// place.
func parseBody(b []byte, contentType string, engine Engine) (Observation, error) {
	format, err := formatOf(contentType)
	if err != nil {
		return Observation{}, err
	}
	return parse(b, format, engine)
}

// parse maps the body b, in format, to an observation. A text body is
// filtered in place.
func parse(b []byte, format expfmt.Format, engine Engine) (Observation, error) {
	if engine < 0 || engine >= numEngines {
		return Observation{}, fmt.Errorf("%w: unknown engine %d", ErrInvalidConfig, int(engine))
	}
	var fams families
	var err error
	if t := format.FormatType(); t == expfmt.TypeTextPlain || t == expfmt.TypeOpenMetrics {
		var lines []int
		if b, lines, err = filter(b, wanted[engine], make([]int, 0, 64)); err != nil {
			return Observation{}, err
		}
		p := expfmt.NewTextParser(model.UTF8Validation)
		fams, err = p.TextToMetricFamilies(bytes.NewReader(b))
		var pe expfmt.ParseError
		if errors.As(err, &pe) && pe.Line >= 1 && pe.Line <= len(lines) {
			// Report the line number of the unfiltered body.
			return Observation{}, fmt.Errorf("%w: line %d: %s", ErrParse, lines[pe.Line-1], pe.Msg)
		}
	} else {
		fams, err = decodeProto(b, wanted[engine])
	}
	if err != nil {
		return Observation{}, parseErr(err)
	}
	if err := checkDuplicates(fams); err != nil {
		return Observation{}, err
	}
	p := profiles[engine]
	if p == nil {
		if p, err = detect(fams); err != nil {
			return Observation{}, err
		}
	}
	return p.observe(fams)
}

// formatOf returns the exposition format of a Content-Type; "" means text.
func formatOf(contentType string) (expfmt.Format, error) {
	if contentType == "" {
		return expfmt.FmtText, nil
	}
	mediaType, _, err := mime.ParseMediaType(contentType)
	if err != nil {
		return "", fmt.Errorf("%w: Content-Type %q: %v", ErrParse, clip(contentType), err)
	}
	switch mediaType {
	case "text/plain", expfmt.OpenMetricsType, expfmt.ProtoType:
	default:
		return "", fmt.Errorf("%w: Content-Type %q is not a metrics format", ErrParse, clip(contentType))
	}
	format := expfmt.ResponseFormat(http.Header{"Content-Type": {contentType}})
	if format == expfmt.FmtUnknown {
		return "", fmt.Errorf("%w: unsupported Content-Type %q", ErrParse, clip(contentType))
	}
	return format, nil
}

// decodeProto reads the length-delimited protobuf metric families of b that
// want names, as filter keeps the text lines that name them: the others are
// only checked to be well-formed, without decoding them into messages (a body
// of empty or unread messages cost the decoder a hundred times its size).
// It does not use expfmt's protobuf decoder, which accepts any length prefix
// and allocates a buffer of that size before reading: a few bytes of garbage
// could make it allocate gigabytes. Here no message may be longer than the
// rest of b, and the families read may hold at most maxSeries series.
func decodeProto(b []byte, want map[string]bool) (families, error) {
	fams := make(families)
	metrics, elements := 0, 0
	for len(b) > 0 {
		size, n := protowire.ConsumeVarint(b)
		if n < 0 {
			return nil, fmt.Errorf("length prefix: %w", protowire.ParseError(n))
		}
		b = b[n:]
		if size > uint64(len(b)) {
			return nil, fmt.Errorf("a message of %d bytes runs past the body's end", size)
		}
		msg := b[:size]
		b = b[size:]
		name, count, parts, err := familyHeader(msg)
		if err != nil {
			return nil, err
		}
		if !want[name] {
			continue
		}
		if metrics += count; metrics > maxSeries {
			return nil, fmt.Errorf("more than %d series in the metrics read", maxSeries)
		}
		if elements += parts; elements > maxParts {
			return nil, fmt.Errorf("more than %d labels, buckets or other parts of series in the metrics read", maxParts)
		}
		mf := new(dto.MetricFamily)
		if err := proto.Unmarshal(msg, mf); err != nil {
			return nil, err
		}
		if len(mf.Metric) == 0 {
			continue
		}
		// A second message of one family would replace the first; the
		// text parser refuses a family declared twice, and so does this.
		if _, ok := fams[mf.GetName()]; ok {
			return nil, fmt.Errorf("metric family %q appears twice", clip(mf.GetName()))
		}
		fams[mf.GetName()] = mf
	}
	return fams, nil
}

// maxSeries bounds the series of the families read, in every format: each
// costs the parser allocations of a hundred bytes or more, for as little as
// two bytes of protobuf or some thirty of text (a 4 MiB text body of short
// series made it allocate 50 MB). An engine exposes a few per metric read
// (one per model, rank or process), and vllm:lora_requests_info one per
// combination of adapters seen, well below it.
const maxSeries = 1 << 16

// maxParts bounds the parts of the series of the families read from
// protobuf: their labels, buckets, quantiles and the other messages and
// strings they hold (see parts). Each costs the decoder an allocation, for
// as little as two bytes (a 2 MB body of one series with a million empty
// labels made it allocate 111 MB), as the labels of a text line cost its
// parser (see maxLabels). An engine's series of the metrics read have a
// handful each.
const maxParts = 4 * maxSeries

// familyHeader returns the name (field 1) of the serialized MetricFamily
// msg, the number of its metrics (field 4) and their parts (see parts),
// checking its wire format.
func familyHeader(msg []byte) (name string, metrics, n int, err error) {
	for len(msg) > 0 {
		num, typ, k := protowire.ConsumeTag(msg)
		if k < 0 {
			return "", 0, 0, protowire.ParseError(k)
		}
		msg = msg[k:]
		if typ == protowire.BytesType && (num == 1 || num == 4) {
			v, k := protowire.ConsumeBytes(msg)
			if k < 0 {
				return "", 0, 0, protowire.ParseError(k)
			}
			msg = msg[k:]
			if num == 1 {
				name = string(v)
			} else {
				metrics++
				n += parts(v, false)
			}
			continue
		}
		if num == 4 {
			metrics++
		}
		k = protowire.ConsumeFieldValue(num, typ, msg)
		if k < 0 {
			return "", 0, 0, protowire.ParseError(k)
		}
		msg = msg[k:]
	}
	return name, metrics, n, nil
}

// parts counts the length-delimited fields of the serialized Metric msg
// (its labels, its value's message) and those of its summary (field 4: its
// quantiles) or histogram (field 7: its buckets, spans and exemplars), each
// of which the decoder allocates. Malformed input stops the count (the
// decoder refuses it).
func parts(msg []byte, nested bool) int {
	n := 0
	for len(msg) > 0 {
		num, typ, k := protowire.ConsumeTag(msg)
		if k < 0 {
			return n
		}
		msg = msg[k:]
		if typ == protowire.BytesType {
			v, k := protowire.ConsumeBytes(msg)
			if k < 0 {
				return n
			}
			n++
			if !nested && (num == 4 || num == 7) {
				n += parts(v, true)
			}
			msg = msg[k:]
			continue
		}
		k = protowire.ConsumeFieldValue(num, typ, msg)
		if k < 0 {
			return n
		}
		msg = msg[k:]
	}
	return n
}

// checkDuplicates returns an error wrapping [ErrParse] if a family of fams
// has two series with the same labels. Neither parser rejects them (expfmt's
// text parser appends a repeated line as another series), and the sums
// would count the value twice; Prometheus keeps only one of such samples.
// No engine writes them: prometheus_client's multiprocess mode merges the
// processes' copies or tells them apart by pid.
func checkDuplicates(fams families) error {
	var seen map[string]struct{}
	for name, fam := range fams {
		if len(fam.Metric) < 2 {
			continue
		}
		if seen == nil {
			seen = make(map[string]struct{}, len(fam.Metric))
		}
		clear(seen)
		for _, m := range fam.Metric {
			k := otherLabels(m, nil)
			if _, ok := seen[k]; ok {
				return fmt.Errorf("%w: duplicate series %s{%s}", ErrParse, name, clip(k))
			}
			seen[k] = struct{}{}
		}
	}
	return nil
}

func parseErr(err error) error {
	if errors.Is(err, ErrBodyTooLarge) || errors.Is(err, ErrParse) {
		return err
	}
	return fmt.Errorf("%w: %v", ErrParse, err)
}
