package signals

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/llmlb/llmlb"
)

// OrcaHeader is the HTTP response header that carries an ORCA load report,
// as Envoy and vLLM name it.
const OrcaHeader = "endpoint-load-metrics"

// maxOrcaHeader bounds the size of an ORCA header value accepted, and
// maxOrcaMetrics the number of map entries in a report.
const (
	maxOrcaHeader  = 16 << 10
	maxOrcaMetrics = 256
)

// OrcaReport is an ORCA load report (xds.data.orca.v3.OrcaLoadReport).
// Utilization, RequestCost and NamedMetrics are nil when empty.
type OrcaReport struct {
	// CPUUtilization, MemUtilization and ApplicationUtilization are
	// fractions of the endpoint's resources in use (CPU and application
	// utilization may exceed 1 past a soft limit).
	CPUUtilization         float64
	MemUtilization         float64
	ApplicationUtilization float64
	// RPSFractional is the endpoint's requests per second; EPS its errors
	// per second.
	RPSFractional float64
	EPS           float64
	// Utilization holds named resource utilizations, fractions in [0, 1].
	Utilization map[string]float64
	// RequestCost holds named absolute costs of the request the report
	// came with.
	RequestCost map[string]float64
	// NamedMetrics holds application-specific metrics, such as an engine's
	// KV-cache usage and queue length.
	NamedMetrics map[string]float64
}

// ParseOrca parses the value of an [OrcaHeader] header. Three forms exist,
// each starting with its format name:
//
//	TEXT cpu_utilization=0.3, rps_fractional=10, named_metrics.kv_cache_usage_perc=0.4
//	JSON {"cpu_utilization": 0.3, "named_metrics": {"kv_cache_usage_perc": 0.4}}
//	BIN <base64 of the serialized OrcaLoadReport protobuf>
//
// In TEXT, a field may also be written name:value, as Envoy's parser
// (source/common/orca/orca_parser.cc) reads it where vLLM writes name=value.
// Map entries are written with the prefixes named_metrics.,
// utilization. and request_cost.; an unknown field, a duplicate, or a value
// that is not a finite number is an error wrapping [ErrORCA], as is a
// negative utilization or rate. In JSON, a field is named as in the proto3
// JSON mapping (cpuUtilization) or as in the proto (cpu_utilization),
// matched exactly; a field given twice, under either name, and a map key
// given twice are duplicates there too.
func ParseOrca(header string) (OrcaReport, error) {
	if len(header) > maxOrcaHeader {
		return OrcaReport{}, fmt.Errorf("%w: header is %d bytes, above %d", ErrORCA, len(header), maxOrcaHeader)
	}
	format, body := cutFormat(header)
	var r OrcaReport
	var err error
	switch format {
	case "TEXT":
		err = r.parseText(body)
	case "JSON":
		err = r.parseJSON(body)
	case "BIN":
		err = r.parseBin(body)
	default:
		return OrcaReport{}, fmt.Errorf("%w: unsupported format %q (want TEXT, JSON or BIN)", ErrORCA, truncate(format))
	}
	if err == nil {
		err = r.check()
	}
	if err != nil {
		return OrcaReport{}, err
	}
	return r, nil
}

func truncate(s string) string {
	if len(s) > 32 {
		return s[:32] + "..."
	}
	return s
}

func (r *OrcaReport) parseText(body string) error {
	if body == "" {
		return fmt.Errorf("%w: empty TEXT report", ErrORCA)
	}
	seen := make(map[string]bool)
	for field := range strings.SplitSeq(body, ",") {
		name, val, ok := strings.Cut(strings.TrimSpace(field), "=")
		if !ok {
			// Envoy's native form before its format prefixes
			// (source/common/orca/orca_parser.cc, v1.29) separates
			// with a colon.
			name, val, ok = strings.Cut(strings.TrimSpace(field), ":")
		}
		name, val = strings.TrimSpace(name), strings.TrimSpace(val)
		if !ok || name == "" || val == "" {
			return fmt.Errorf("%w: TEXT field %q is not name=value (or name:value)", ErrORCA, truncate(field))
		}
		if seen[name] {
			return fmt.Errorf("%w: duplicate field %q", ErrORCA, truncate(name))
		}
		seen[name] = true
		v, err := strconv.ParseFloat(val, 64)
		if err != nil {
			return fmt.Errorf("%w: field %q: value %q is not a number", ErrORCA, truncate(name), truncate(val))
		}
		if err := r.set(name, v); err != nil {
			return err
		}
	}
	return nil
}

// set stores the TEXT field name.
func (r *OrcaReport) set(name string, v float64) error {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return fmt.Errorf("%w: field %q is %v", ErrORCA, truncate(name), v)
	}
	switch name {
	case "cpu_utilization":
		r.CPUUtilization = v
	case "mem_utilization":
		r.MemUtilization = v
	case "application_utilization":
		r.ApplicationUtilization = v
	case "rps_fractional":
		r.RPSFractional = v
	case "eps":
		r.EPS = v
	default:
		prefix, key, ok := strings.Cut(name, ".")
		if !ok || key == "" {
			return fmt.Errorf("%w: unknown field %q", ErrORCA, truncate(name))
		}
		var m *map[string]float64
		switch prefix {
		case "named_metrics":
			m = &r.NamedMetrics
		case "utilization":
			m = &r.Utilization
		case "request_cost":
			m = &r.RequestCost
		default:
			return fmt.Errorf("%w: unknown field %q", ErrORCA, truncate(name))
		}
		return put(m, key, v)
	}
	return nil
}

func put(m *map[string]float64, key string, v float64) error {
	if *m == nil {
		*m = make(map[string]float64)
	}
	if len(*m) >= maxOrcaMetrics {
		return fmt.Errorf("%w: more than %d map entries", ErrORCA, maxOrcaMetrics)
	}
	(*m)[key] = v
	return nil
}

// orcaJSONFields maps each name a field of OrcaLoadReport has in its proto3
// JSON mapping, the lowerCamelCase JSON name and the original field name,
// to the latter.
var orcaJSONFields = map[string]string{
	"cpu_utilization": "cpu_utilization", "cpuUtilization": "cpu_utilization",
	"mem_utilization": "mem_utilization", "memUtilization": "mem_utilization",
	"application_utilization": "application_utilization", "applicationUtilization": "application_utilization",
	"rps_fractional": "rps_fractional", "rpsFractional": "rps_fractional",
	"eps":          "eps",
	"utilization":  "utilization",
	"request_cost": "request_cost", "requestCost": "request_cost",
	"named_metrics": "named_metrics", "namedMetrics": "named_metrics",
}

// parseJSON reads a JSON report as protobuf's JSON parser reads an
// OrcaLoadReport, the parser Envoy's ORCA parser hands JSON reports to
// (MessageUtil::loadFromJsonNoThrow in source/common/orca/orca_parser.cc;
// ParseField and ParseMap in src/google/protobuf/json/internal/parser.cc,
// protobuf 22 and later): field names match exactly, in either of their
// two forms; a field set twice (under one name or both) and a map key
// repeated are errors, as they are in TEXT; null leaves a field unset.
// vLLM, the producer of JSON reports, writes them with json.dumps of a
// dict (create_orca_header in vllm/entrypoints/openai/orca_metrics.py),
// which holds no duplicate; grpc-go's orca package sends and reads only
// the binary form (orca/internal/internal.go, ToLoadReport).
func (r *OrcaReport) parseJSON(body string) error {
	dec := json.NewDecoder(strings.NewReader(body))
	if err := jsonDelim(dec, '{'); err != nil {
		return err
	}
	seen := make(map[string]bool) // the fields set so far
	for dec.More() {
		name, err := jsonKey(dec)
		if err != nil {
			return err
		}
		field, ok := orcaJSONFields[name]
		if !ok {
			return fmt.Errorf("%w: JSON: unknown field %q", ErrORCA, truncate(name))
		}
		if seen[field] {
			return fmt.Errorf("%w: JSON: duplicate field %q", ErrORCA, truncate(name))
		}
		seen[field] = true
		switch field {
		case "utilization", "request_cost", "named_metrics":
			err = r.jsonMap(dec, field)
		default:
			var v float64
			var null bool
			if v, null, err = jsonNumber(dec, name); err == nil && !null {
				err = r.set(field, v)
			}
		}
		if err != nil {
			return err
		}
	}
	if err := jsonDelim(dec, '}'); err != nil {
		return err
	}
	if _, err := dec.Token(); err != io.EOF {
		return fmt.Errorf("%w: JSON: trailing data after the report", ErrORCA)
	}
	return nil
}

// jsonMap reads the map field of a JSON report, or null.
func (r *OrcaReport) jsonMap(dec *json.Decoder, field string) error {
	t, err := dec.Token()
	if err != nil {
		return fmt.Errorf("%w: JSON: %v", ErrORCA, err)
	}
	if t == nil {
		return nil
	}
	if t != json.Delim('{') {
		return fmt.Errorf("%w: JSON: %s is not an object", ErrORCA, field)
	}
	for dec.More() {
		key, err := jsonKey(dec)
		if err != nil {
			return err
		}
		name := field + "." + key
		v, null, err := jsonNumber(dec, name)
		if err != nil {
			return err
		}
		if null {
			return fmt.Errorf("%w: JSON: %s is null", ErrORCA, truncate(name))
		}
		m := r.mapField(field)
		if _, dup := (*m)[key]; dup {
			return fmt.Errorf("%w: JSON: duplicate key %q", ErrORCA, truncate(name))
		}
		if err := put(m, key, v); err != nil {
			return err
		}
	}
	return jsonDelim(dec, '}')
}

// mapField returns the map field named field of r.
func (r *OrcaReport) mapField(field string) *map[string]float64 {
	switch field {
	case "utilization":
		return &r.Utilization
	case "request_cost":
		return &r.RequestCost
	}
	return &r.NamedMetrics
}

// jsonDelim reads the delimiter d.
func jsonDelim(dec *json.Decoder, d json.Delim) error {
	t, err := dec.Token()
	if err != nil {
		return fmt.Errorf("%w: JSON: %v", ErrORCA, err)
	}
	if t != d {
		return fmt.Errorf("%w: JSON: got %v, want %v", ErrORCA, t, d)
	}
	return nil
}

// jsonKey reads the key of an object's member.
func jsonKey(dec *json.Decoder) (string, error) {
	t, err := dec.Token()
	if err != nil {
		return "", fmt.Errorf("%w: JSON: %v", ErrORCA, err)
	}
	k, _ := t.(string) // the decoder returns nothing else where a key goes
	return k, nil
}

// jsonNumber reads the number of field name, or null.
func jsonNumber(dec *json.Decoder, name string) (v float64, null bool, err error) {
	t, err := dec.Token()
	if err != nil {
		return 0, false, fmt.Errorf("%w: JSON: field %q: %v", ErrORCA, truncate(name), err)
	}
	switch t := t.(type) {
	case float64:
		return t, false, nil
	case nil:
		return 0, true, nil
	}
	return 0, false, fmt.Errorf("%w: JSON: field %q is not a number", ErrORCA, truncate(name))
}

// Field numbers of xds.data.orca.v3.OrcaLoadReport.
const (
	fieldCPU         = 1
	fieldMem         = 2
	fieldRPS         = 3
	fieldRequestCost = 4
	fieldUtilization = 5
	fieldRPSFrac     = 6
	fieldEPS         = 7
	fieldNamed       = 8
	fieldApp         = 9
)

func (r *OrcaReport) parseBin(body string) error {
	b, err := base64.StdEncoding.DecodeString(body)
	if err != nil {
		if b, err = base64.RawStdEncoding.DecodeString(body); err != nil {
			return fmt.Errorf("%w: BIN: %v", ErrORCA, err)
		}
	}
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return fmt.Errorf("%w: BIN: %v", ErrORCA, protowire.ParseError(n))
		}
		b = b[n:]
		var dst *float64
		var dstMap *map[string]float64
		switch num {
		case fieldCPU:
			dst = &r.CPUUtilization
		case fieldMem:
			dst = &r.MemUtilization
		case fieldRPSFrac:
			dst = &r.RPSFractional
		case fieldEPS:
			dst = &r.EPS
		case fieldApp:
			dst = &r.ApplicationUtilization
		case fieldRequestCost:
			dstMap = &r.RequestCost
		case fieldUtilization:
			dstMap = &r.Utilization
		case fieldNamed:
			dstMap = &r.NamedMetrics
		}
		switch {
		case dst != nil && typ == protowire.Fixed64Type:
			v, n := protowire.ConsumeFixed64(b)
			if n < 0 {
				return fmt.Errorf("%w: BIN field %d: %v", ErrORCA, num, protowire.ParseError(n))
			}
			*dst, b = math.Float64frombits(v), b[n:]
		case dstMap != nil && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return fmt.Errorf("%w: BIN field %d: %v", ErrORCA, num, protowire.ParseError(n))
			}
			b = b[n:]
			k, f, err := mapEntry(v)
			if err != nil {
				return fmt.Errorf("%w: BIN field %d: %v", ErrORCA, num, err)
			}
			if err := put(dstMap, k, f); err != nil {
				return err
			}
		case dst != nil || dstMap != nil:
			return fmt.Errorf("%w: BIN field %d has wire type %d", ErrORCA, num, typ)
		default: // rps (deprecated) and unknown fields are skipped
			n := protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return fmt.Errorf("%w: BIN field %d: %v", ErrORCA, num, protowire.ParseError(n))
			}
			b = b[n:]
		}
	}
	return nil
}

// mapEntry decodes a map<string, double> entry.
func mapEntry(b []byte) (string, float64, error) {
	var key string
	var val float64
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return "", 0, protowire.ParseError(n)
		}
		b = b[n:]
		switch {
		case num == 1 && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return "", 0, protowire.ParseError(n)
			}
			key, b = string(v), b[n:]
		case num == 2 && typ == protowire.Fixed64Type:
			v, n := protowire.ConsumeFixed64(b)
			if n < 0 {
				return "", 0, protowire.ParseError(n)
			}
			val, b = math.Float64frombits(v), b[n:]
		default:
			n := protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return "", 0, protowire.ParseError(n)
			}
			b = b[n:]
		}
	}
	return key, val, nil
}

// check rejects non-finite values, negative utilizations (named ones too)
// and rates, and empty map keys.
func (r *OrcaReport) check() error {
	for _, f := range []struct {
		name string
		v    float64
	}{
		{"cpu_utilization", r.CPUUtilization},
		{"mem_utilization", r.MemUtilization},
		{"application_utilization", r.ApplicationUtilization},
		{"rps_fractional", r.RPSFractional},
		{"eps", r.EPS},
	} {
		if math.IsNaN(f.v) || math.IsInf(f.v, 0) || f.v < 0 {
			return fmt.Errorf("%w: %s is %v", ErrORCA, f.name, f.v)
		}
	}
	for _, m := range []struct {
		name string
		m    map[string]float64
	}{{"utilization", r.Utilization}, {"request_cost", r.RequestCost}, {"named_metrics", r.NamedMetrics}} {
		for k, v := range m.m {
			if k == "" {
				return fmt.Errorf("%w: %s has an empty key", ErrORCA, m.name)
			}
			if math.IsNaN(v) || math.IsInf(v, 0) || (v < 0 && m.name == "utilization") {
				return fmt.Errorf("%w: %s.%s is %v", ErrORCA, m.name, truncate(k), v)
			}
		}
	}
	return nil
}

// Default named metrics read by [OrcaMapping]; vLLM reports the first and
// third in its ORCA headers. It reports each from the first sample of its
// Prometheus metric (vllm/entrypoints/openai/orca_metrics.py,
// get_named_metrics_from_prometheus), so a data-parallel vLLM's header
// carries its first engine's waiting requests only: scrape such a server
// (see [Scraper]), whose metrics have one series per engine.
const (
	DefaultOrcaKVUsage = "kv_cache_usage_perc"
	DefaultOrcaRunning = "num_requests_running"
	DefaultOrcaWaiting = "num_requests_waiting"
	// orcaKVUsageAlt is also tried when KVUsage is left at its default.
	orcaKVUsageAlt = "kv_cache_utilization"
)

// OrcaMapping names the entries of an ORCA report's named_metrics (or, for
// KV usage, utilization) that make up a [llmlb.Load]. The zero value uses
// the defaults. Its methods only read it and may be called concurrently.
type OrcaMapping struct {
	// KVUsage names the KV-cache usage fraction. "" means
	// [DefaultOrcaKVUsage], falling back to "kv_cache_utilization".
	KVUsage string
	// Running and Waiting name the request counts. "" means
	// [DefaultOrcaRunning] and [DefaultOrcaWaiting].
	Running string
	Waiting string
	// KVBlocks and BlockSize name the KV capacity in blocks and the tokens
	// per block; "" means not reported.
	KVBlocks  string
	BlockSize string
}

// Load maps r to an observation taken at at. A metric the report lacks is
// left at 0 (NaN for KV usage); the balancer never estimates fewer requests
// than it has outstanding itself. A report with none of the mapped metrics,
// or with a mapped value out of range, is an error wrapping [ErrORCA].
func (m OrcaMapping) Load(r OrcaReport, at time.Time) (llmlb.Load, error) {
	l, _, err := m.load(r, at)
	return l, err
}

// load is Load that also returns the fields of the load the report set, as
// a mask of the f* bits.
func (m OrcaMapping) load(r OrcaReport, at time.Time) (llmlb.Load, uint8, error) {
	l := llmlb.Load{At: at, KVUsage: math.NaN()}
	var set uint8
	kvNames := []string{m.KVUsage}
	if m.KVUsage == "" {
		kvNames = []string{DefaultOrcaKVUsage, orcaKVUsageAlt}
	}
	for _, name := range kvNames {
		v, ok := r.NamedMetrics[name]
		if !ok {
			v, ok = r.Utilization[name]
		}
		if ok {
			if !(v >= 0 && v <= 1+kvSlack) {
				return llmlb.Load{}, 0, fmt.Errorf("%w: %s is %v, outside [0, 1]", ErrORCA, name, v)
			}
			l.KVUsage, set = min(v, 1), set|1<<fKVUsage
			break
		}
	}
	for _, c := range []struct {
		name, def string
		limit     float64
		dst       *int
		field     int
	}{
		{m.Running, DefaultOrcaRunning, maxRequests, &l.Running, fRunning},
		{m.Waiting, DefaultOrcaWaiting, maxRequests, &l.Waiting, fWaiting},
		{m.KVBlocks, "", maxBlocks, &l.KVBlocks, fKVBlocks},
		{m.BlockSize, "", maxBlockSize, &l.BlockSize, fBlockSize},
	} {
		name := c.name
		if name == "" {
			name = c.def
		}
		v, ok := r.NamedMetrics[name]
		if name == "" || !ok {
			continue
		}
		if !(v >= 0 && v <= c.limit) {
			return llmlb.Load{}, 0, fmt.Errorf("%w: %s is %v, outside [0, %v]", ErrORCA, name, v, c.limit)
		}
		*c.dst, set = int(math.Round(v)), set|1<<c.field
	}
	if set == 0 {
		return llmlb.Load{}, 0, fmt.Errorf("%w: report has none of the mapped metrics", ErrORCA)
	}
	return l, set, nil
}

// RecordOrca records the ORCA report r, received at at, into the
// observation of the endpoint key, mapped with m: it sets the fields the
// report has, unless newer ones are held, and the others keep their value
// (see [Store]). It is the entry point for reports that arrive already
// decoded, such as grpc-go's per-call server load.
func (s *Store) RecordOrca(key string, r OrcaReport, at time.Time, m OrcaMapping) error {
	l, set, err := m.load(r, at)
	if err != nil {
		return fmt.Errorf("%w (endpoint %q)", err, key)
	}
	o := observationOf(l)
	return s.record(key, &o, set, false)
}

// RecordResponse records the ORCA report in resp's [OrcaHeader] header, if
// any, into the observation of the endpoint key as [Store.RecordOrca] does,
// taken at at (when the response headers arrived), mapped with m. It
// reports whether the response carried a report; a malformed one is an
// error and records nothing. A TEXT report without fields, which vLLM sends
// when it has no gauge to report, is no report.
//
// A repeated header is read as Envoy reads it: its first value gives the
// format, and a JSON or BIN report is that value alone. A TEXT report also
// takes the fields of the later TEXT values (Envoy drops them), as one
// comma-separated list: a value of bare "TEXT" adds none, a field repeated
// across values is a duplicate, and values of another format are ignored.
func (s *Store) RecordResponse(key string, resp *http.Response, at time.Time, m OrcaMapping) (bool, error) {
	if resp == nil {
		return false, nil
	}
	vals := resp.Header.Values(OrcaHeader)
	if len(vals) == 0 {
		return false, nil
	}
	h, ok := orcaValue(vals)
	if !ok {
		// vLLM's header when it has no gauge to report.
		return false, nil
	}
	r, err := ParseOrca(h)
	if err != nil {
		return true, fmt.Errorf("%w (endpoint %q)", err, key)
	}
	return true, s.RecordOrca(key, r, at, m)
}

// orcaValue returns the report that the values vals of an [OrcaHeader]
// header carry, as one value for [ParseOrca] (see [Store.RecordResponse]),
// and false if it is a TEXT report without fields.
func orcaValue(vals []string) (string, bool) {
	format, body := cutFormat(vals[0])
	if format != "TEXT" {
		return vals[0], true
	}
	if len(vals) == 1 {
		return vals[0], body != ""
	}
	var b strings.Builder
	b.WriteString("TEXT ")
	n := 0
	for _, v := range vals {
		if b.Len() > maxOrcaHeader {
			break // too long already: ParseOrca refuses it
		}
		format, body := cutFormat(v)
		if format != "TEXT" || body == "" {
			continue
		}
		if n > 0 {
			b.WriteString(", ")
		}
		b.WriteString(body)
		n++
	}
	return b.String(), n > 0
}

// cutFormat splits a header value into its format name and its report, as
// [ParseOrca] does.
func cutFormat(v string) (format, body string) {
	format, body, _ = strings.Cut(strings.TrimSpace(v), " ")
	return format, strings.TrimSpace(body)
}
