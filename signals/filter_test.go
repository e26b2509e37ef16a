package signals

import (
	"bytes"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// unfiltered maps b with every line given to the parser.
func unfiltered(b []byte, engine Engine) (Observation, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(b))
	if err != nil {
		return Observation{}, err
	}
	if err := checkDuplicates(fams); err != nil {
		return Observation{}, err
	}
	prof := profiles[engine]
	if prof == nil {
		if prof, err = detect(fams); err != nil {
			return Observation{}, err
		}
	}
	return prof.observe(fams)
}

// sameObservation compares observations, NaN equal to NaN.
func sameObservation(a, b Observation) bool {
	for _, p := range []*Observation{&a, &b} {
		for _, f := range []*float64{&p.KVUsage, &p.Preemptions, &p.PrefixQueries, &p.PrefixHits} {
			if math.IsNaN(*f) {
				*f = -1
			}
		}
	}
	return reflect.DeepEqual(a, b)
}

// checkFilter fails if filtering changes the observation of a body the
// parser accepts whole.
func checkFilter(t *testing.T, b []byte, engine Engine) {
	want, err := unfiltered(b, engine)
	if err != nil {
		return
	}
	got, err := parse(bytes.Clone(b), expfmt.FmtText, engine)
	if err != nil && (strings.Contains(err.Error(), "too many labels") || strings.Contains(err.Error(), "series in the metrics read") ||
		strings.Contains(err.Error(), "labels in the metrics read")) {
		return // refused on purpose, above maxLabelWork, maxSeries or maxLabels
	}
	if err != nil {
		t.Fatalf("filtered parse failed where the whole body parses: %v", err)
	}
	if !sameObservation(got, want) {
		t.Fatalf("filtered %+v, whole %+v", got, want)
	}
}

func TestFilterKeepsObservation(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "*.prom"))
	if err != nil || len(files) == 0 {
		t.Fatal("no fixtures", err)
	}
	for _, name := range files {
		b, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		for e := range numEngines {
			checkFilter(t, b, e)
		}
	}
}

// FuzzFilter checks that dropping the lines no profile reads never changes
// the observation of an exposition the parser accepts whole.
func FuzzFilter(f *testing.F) {
	files, _ := filepath.Glob(filepath.Join("testdata", "*.prom"))
	for _, name := range files {
		b, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b, uint8(0))
	}
	f.Add([]byte("# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{a=\"b\"} 1\n  vllm:num_requests_waiting 2\n"), uint8(1))
	f.Fuzz(func(t *testing.T, b []byte, engine uint8) {
		checkFilter(t, b, Engine(engine%uint8(numEngines)))
	})
}
