package httplb

import (
	"math/bits"
	"strconv"
	"strings"
)

// This file names the kind of a request, its llmlb.Request.Feature, for
// learning its output length (llmlb.WithOutputPrediction): the model, and
// for a reasoning model the effort or thinking budget asked for, which
// predict the length of its output better than anything else known before
// it is sent.

// efforts are the reasoning efforts a Feature names: those of OpenAI's
// reasoning_effort and reasoning.effort, and of Anthropic's
// output_config.effort. A Feature names no other value, so that a client
// cannot make kinds of its own with them.
var efforts = [...]string{"none", "minimal", "low", "medium", "high", "xhigh", "max"}

// knownEffort returns the known reasoning effort of the raw string v, or "".
func knownEffort(v []byte) string {
	var buf [maxKeyLen]byte
	s := shortString(v, &buf)
	for _, e := range efforts {
		if string(s) == e {
			return e
		}
	}
	return ""
}

// shortString returns the raw string v decoded into buf, or nil if v is
// not a string or is longer than buf.
func shortString(v []byte, buf *[maxKeyLen]byte) []byte {
	if !isString(v) {
		return nil
	}
	return keyName(v, buf)
}

// memberOf returns the raw value of the last member named key of the raw
// object v; nil if there is none or v is not an object.
func memberOf(v []byte, key string) []byte {
	var val []byte
	var buf [maxKeyLen]byte
	l, _ := listOf(v, '{')
	for k, mv, ok := l.member(); ok; k, mv, ok = l.member() {
		if string(keyName(k, &buf)) == key {
			val = mv
		}
	}
	return val
}

// effort returns the reasoning effort the body asks for: its
// reasoning_effort (OpenAI chat and completions), else its reasoning.effort
// (OpenAI responses), else its output_config.effort (Anthropic messages),
// the first of them that is known; "" if none is.
func (f *fields) effort() string {
	if e := knownEffort(f.reasoningEffort); e != "" {
		return e
	}
	if e := knownEffort(memberOf(f.reasoning, "effort")); e != "" {
		return e
	}
	return knownEffort(memberOf(f.outputConfig, "effort"))
}

// thinkingBudget returns the Feature part of Anthropic's thinking object: its
// budget_tokens rounded up to a power of two ("thinking<=4096"), or
// "thinking=adaptive" for adaptive thinking; "" if thinking is disabled or
// absent.
func (f *fields) thinkingBudget() string {
	if len(f.thinking) == 0 {
		return ""
	}
	var buf [maxKeyLen]byte
	switch string(shortString(memberOf(f.thinking, "type"), &buf)) {
	case "disabled":
		return ""
	case "adaptive":
		return "thinking=adaptive"
	}
	n := count(memberOf(f.thinking, "budget_tokens"))
	if n == 0 {
		return ""
	}
	return "thinking<=" + strconv.FormatUint(1<<bits.Len(uint(n-1)), 10)
}

// feature returns the Feature of a request for model with the body's
// fields f, and label, the value of [ParserConfig.FeatureHeader]: the model,
// then "|effort=" and the known effort, if any, then "|" and the thinking
// part, if any, then "|" and label, if not "". It allocates only if there
// is more than the model.
func feature(model string, f *fields, label string) string {
	eff, think := "", ""
	if f != nil {
		eff, think = f.effort(), f.thinkingBudget()
	}
	if eff == "" && think == "" && label == "" {
		return model
	}
	var b strings.Builder
	b.Grow(len(model) + len("|effort=") + len(eff) + 1 + len(think) + 1 + len(label))
	b.WriteString(model)
	if eff != "" {
		b.WriteString("|effort=")
		b.WriteString(eff)
	}
	if think != "" {
		b.WriteByte('|')
		b.WriteString(think)
	}
	if label != "" {
		b.WriteByte('|')
		b.WriteString(label)
	}
	return b.String()
}
