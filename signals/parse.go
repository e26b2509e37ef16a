package signals

import (
	"bufio"
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

	"github.com/llmlb/llmlb"
)

// Observation is one engine observation with the extras a scrape can carry
// beyond [llmlb.Load].
type Observation struct {
	llmlb.Load
	// Engine is the dialect the observation was read in (the detected one
	// when parsing with EngineAuto); EngineAuto for pushed loads.
	Engine Engine
	// Preemptions is the engine's cumulative count of preempted requests
	// (vllm:num_preemptions_total); a rising rate means the engine is
	// evicting work to make room. NaN when not reported.
	Preemptions float64
	// PrefixQueries and PrefixHits are the engine's cumulative prefix-cache
	// lookups and hits, in tokens (vllm:prefix_cache_queries_total and
	// vllm:prefix_cache_hits_total); their rates give the measured hit rate.
	// NaN when not reported.
	PrefixQueries float64
	PrefixHits    float64
}

// observationOf wraps a pushed load: the extras are not reported.
func observationOf(l llmlb.Load) Observation {
	nan := math.NaN()
	return Observation{Load: l, Preemptions: nan, PrefixQueries: nan, PrefixHits: nan}
}

// maxOpenMetricsLine bounds the length of a line handed to the OpenMetrics
// parser, whose cost grows faster than linearly with line length.
const maxOpenMetricsLine = 64 << 10

// Parse reads one metrics exposition from r and maps it to an observation
// with the engine's profile; [EngineAuto] detects the engine from the metric
// names. contentType is the response's Content-Type: the Prometheus text
// format (text/plain, also assumed when empty), OpenMetrics
// (application/openmetrics-text) and delimited protobuf are read with
// prometheus/common/expfmt; anything else, such as text/html, is an error
// wrapping [ErrParse].
//
// Counts summed over several series (one per model or data-parallel rank) are
// added up; KV usage fractions are averaged. The running and waiting counts
// are required ([ErrMissingMetric] if absent); KV usage is NaN and the KV
// capacity 0 when not reported. A NaN, infinite, negative or implausibly
// large value is an error wrapping [ErrInvalidValue] naming the metric.
//
// Parse reads all of r; bound it (the [Scraper] caps the body). The returned
// observation's At is zero: the caller stamps it.
func Parse(r io.Reader, contentType string, engine Engine) (Observation, error) {
	if engine < 0 || engine >= numEngines {
		return Observation{}, fmt.Errorf("%w: unknown engine %d", ErrInvalidConfig, int(engine))
	}
	fams, err := decode(r, contentType)
	if err != nil {
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

// decode parses r into metric families according to contentType.
func decode(r io.Reader, contentType string) (families, error) {
	format := expfmt.FmtText
	if contentType != "" {
		mediaType, _, err := mime.ParseMediaType(contentType)
		if err != nil {
			return nil, fmt.Errorf("%w: Content-Type %q: %v", ErrParse, contentType, err)
		}
		switch mediaType {
		case "text/plain", expfmt.OpenMetricsType, expfmt.ProtoType:
		default:
			return nil, fmt.Errorf("%w: Content-Type %q is not a metrics format", ErrParse, contentType)
		}
		h := http.Header{"Content-Type": {contentType}}
		if format = expfmt.ResponseFormat(h); format == expfmt.FmtUnknown {
			return nil, fmt.Errorf("%w: unsupported Content-Type %q", ErrParse, contentType)
		}
	}
	switch format.FormatType() {
	case expfmt.TypeTextPlain:
		p := expfmt.NewTextParser(model.UTF8Validation)
		fams, err := p.TextToMetricFamilies(r)
		if err != nil {
			return nil, parseErr(err)
		}
		return fams, nil
	case expfmt.TypeOpenMetrics:
		r = &lineLimitReader{r: bufio.NewReader(r), max: maxOpenMetricsLine}
	}
	dec := expfmt.NewDecoder(r, format)
	fams := make(families)
	for {
		mf := new(dto.MetricFamily)
		err := dec.Decode(mf)
		if errors.Is(err, io.EOF) {
			return fams, nil
		}
		if err != nil {
			return nil, parseErr(err)
		}
		if len(mf.Metric) > 0 {
			fams[mf.GetName()] = mf
		}
	}
}

func parseErr(err error) error {
	if errors.Is(err, ErrBodyTooLarge) || errors.Is(err, ErrParse) {
		return err
	}
	return fmt.Errorf("%w: %v", ErrParse, err)
}

// lineLimitReader fails once a line exceeds max bytes.
type lineLimitReader struct {
	r    *bufio.Reader
	max  int
	line int // length of the current line so far
}

func (l *lineLimitReader) Read(p []byte) (int, error) {
	n, err := l.r.Read(p)
	for rest := p[:n]; ; {
		i := bytes.IndexByte(rest, '\n')
		if i < 0 {
			l.line += len(rest)
			break
		}
		if l.line+i > l.max {
			return 0, fmt.Errorf("%w: line longer than %d bytes", ErrParse, l.max)
		}
		l.line, rest = 0, rest[i+1:]
	}
	if l.line > l.max {
		return 0, fmt.Errorf("%w: line longer than %d bytes", ErrParse, l.max)
	}
	return n, err
}
