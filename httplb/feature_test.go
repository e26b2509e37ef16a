package httplb

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseFeature(t *testing.T) {
	const msgs = `"messages":[{"role":"user","content":"hi"}]`
	cases := []struct {
		name  string
		body  string
		label string // the feature header's value
		want  string
	}{
		{name: "no effort", body: `{"model":"m",` + msgs + `}`, want: "m"},
		{name: "openai low", body: `{"model":"o4-mini","reasoning_effort":"low",` + msgs + `}`, want: "o4-mini|effort=low"},
		{name: "openai medium", body: `{"model":"o4-mini","reasoning_effort":"medium",` + msgs + `}`, want: "o4-mini|effort=medium"},
		{name: "openai high", body: `{"model":"o4-mini","reasoning_effort":"high",` + msgs + `}`, want: "o4-mini|effort=high"},
		{name: "completions", body: `{"model":"gpt-oss","prompt":"x","reasoning_effort":"minimal"}`, want: "gpt-oss|effort=minimal"},
		{name: "responses", body: `{"model":"gpt-5","input":"hi","reasoning":{"summary":"auto","effort":"xhigh"}}`, want: "gpt-5|effort=xhigh"},
		{name: "reasoning_effort first", body: `{"model":"m","reasoning":{"effort":"low"},"reasoning_effort":"high"}`, want: "m|effort=high"},
		{name: "unknown effort", body: `{"model":"m","reasoning_effort":"turbo"}`, want: "m"},
		{name: "effort case", body: `{"model":"m","reasoning_effort":"High"}`, want: "m"},
		{name: "effort not a string", body: `{"model":"m","reasoning_effort":3,"reasoning":"high"}`, want: "m"},
		{name: "escaped effort", body: `{"model":"m","reasoning_effort":"h\u0069gh"}`, want: "m|effort=high"},
		{name: "unknown effort, then a known one", body: `{"model":"m","reasoning_effort":"turbo","reasoning":{"effort":"none"}}`, want: "m|effort=none"},
		{name: "anthropic thinking", body: `{"model":"claude","max_tokens":8000,"thinking":{"type":"enabled","budget_tokens":1024},` + msgs + `}`, want: "claude|thinking<=1024"},
		{name: "thinking rounded up", body: `{"model":"claude","thinking":{"type":"enabled","budget_tokens":3000}}`, want: "claude|thinking<=4096"},
		{name: "thinking huge", body: `{"model":"claude","thinking":{"type":"enabled","budget_tokens":2147483647}}`, want: "claude|thinking<=2147483648"},
		{name: "thinking disabled", body: `{"model":"claude","thinking":{"type":"disabled","budget_tokens":1024}}`, want: "claude"},
		{name: "thinking bad budget", body: `{"model":"claude","thinking":{"type":"enabled","budget_tokens":"1024"}}`, want: "claude"},
		{name: "thinking adaptive", body: `{"model":"claude","thinking":{"type":"adaptive"},"output_config":{"effort":"max"}}`, want: "claude|effort=max|thinking=adaptive"},
		{name: "anthropic effort", body: `{"model":"claude","output_config":{"effort":"low"},` + msgs + `}`, want: "claude|effort=low"},
		{name: "no model", body: `{"reasoning_effort":"high","prompt":"x"}`, want: "|effort=high"},
		{name: "label", body: `{"model":"m","reasoning_effort":"high"}`, label: "route=summarize", want: "m|effort=high|route=summarize"},
		{name: "label without effort", body: `{"model":"m"}`, label: "step-2", want: "m|step-2"},
		{name: "label without body", label: "step-2", want: "|step-2"},
		{name: "not JSON", body: `{"model":"m"`, want: ""},
		{name: "no body", want: ""},
	}
	p := newParser(t, ParserConfig{FeatureHeader: "x-llmlb-feature"})
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(tc.body))
			if tc.body == "" {
				r.Body = http.NoBody
			}
			if tc.label != "" {
				r.Header.Set("X-Llmlb-Feature", tc.label)
			}
			got, err := p.Parse(r)
			require.NoError(t, err)
			assert.Equal(t, tc.want, got.Feature)
			got, err = p.ParseBody(r, []byte(tc.body))
			require.NoError(t, err)
			assert.Equal(t, tc.want, got.Feature, "ParseBody")
		})
	}
}

// Without a FeatureHeader, no header labels the request.
func TestParseFeatureHeaderUnset(t *testing.T) {
	r := post(`{"model":"m"}`)
	r.Header.Set("X-Llmlb-Feature", "x")
	got, err := newParser(t, ParserConfig{}).Parse(r)
	require.NoError(t, err)
	assert.Equal(t, "m", got.Feature)
}
