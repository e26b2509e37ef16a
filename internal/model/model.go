package model

import (
	"math"
	"time"
)

// Batch describes one engine iteration for an [IterTimeFunc]: the prompt
// tokens prefilled in it, the sequences that each decode one token in it, and
// the fraction of KV blocks held by running sequences when it starts.
type Batch struct {
	// PrefillTokens is the number of prompt tokens the iteration prefills,
	// summed over the sequences whose prefill (or a chunk of it) it runs.
	PrefillTokens int
	// DecodeSeqs is the number of sequences that each decode one token in
	// the iteration.
	DecodeSeqs int
	// KVUsage is the fraction of the replica's KV blocks, in [0, 1], held by
	// running sequences once the iteration's blocks are allocated; cached
	// prefix blocks that no sequence holds do not count.
	KVUsage float64
	// AdapterLoads is the number of LoRA adapters the iteration loads into
	// free or reclaimed adapter slots ([Engine].AdapterSlots) before it
	// runs; the simulator adds [Engine].AdapterLoad per load to the
	// iteration's time.
	AdapterLoads int
}

// IterTimeFunc returns how long an engine iteration takes. It must return a
// positive duration for a batch with any work in it. The simulator calls it
// from one goroutine per run, but runs of several policies go in parallel
// ([Compare]), so a function shared between them must be safe for
// concurrent use.
type IterTimeFunc func(b Batch) time.Duration

// MockerIterTime is the default iteration-time model, the polynomial fitted
// by NVIDIA Dynamo's mocker engine:
//
//	prefill ms = 4.209989e-7*T^2 + 1.518344e-2*T + 16.50142   (T batched prefill tokens)
//	decode  ms = max(1, -25.74*u^2 + 54.01*u + 5.74)          (u active KV fraction)
//
// An iteration that prefills and decodes costs the sum of the two parts: the
// chunked prefill runs in the same forward pass as the decode tokens but the
// model charges each phase its full cost, which is conservative (a mixed
// batch is never cheaper than either phase alone). An iteration with only
// prefill costs the prefill part, one with only decode the decode part.
func MockerIterTime(b Batch) time.Duration {
	ms := 0.0
	if b.PrefillTokens > 0 {
		ms += MockerPrefillMillis(b.PrefillTokens)
	}
	if b.DecodeSeqs > 0 {
		ms += MockerDecodeMillis(b.KVUsage)
	}
	return time.Duration(ms * float64(time.Millisecond))
}

// mockerPrefillFixed is the constant term of the mocker's prefill
// polynomial, in milliseconds: what a prefill iteration costs beyond its
// tokens.
const mockerPrefillFixed = 16.50142

// MockerFusedIterTime is [MockerIterTime] for an engine whose mixed
// iteration is one forward pass that pays a fixed cost once: an iteration
// that prefills and decodes costs the prefill part's tokens (its polynomial
// without the constant 16.5 ms) plus the larger of that constant and the
// decode part. It is never cheaper than either phase alone and never dearer
// than [MockerIterTime]: a mixed iteration costs the constant less where the
// decode part exceeds it (KV usage above about 0.22), and the decode part
// less below that. Iterations of one phase cost what they cost under
// MockerIterTime.
//
// The mocker's two polynomials were fitted on iterations of one phase each;
// a real engine's mixed iteration, one forward pass, costs less than their
// sum, by how much depending on the engine and the batch. The choice decides which policy keeps decoding steadiest at
// saturation: under the sum, every sequence decoding in an iteration that
// also prefills waits the whole constant, which rewards sending the prompts
// that arrive close together to one replica, to share it.
func MockerFusedIterTime(b Batch) time.Duration {
	var ms float64
	switch {
	case b.PrefillTokens > 0 && b.DecodeSeqs > 0:
		ms = MockerPrefillMillis(b.PrefillTokens) - mockerPrefillFixed +
			max(mockerPrefillFixed, MockerDecodeMillis(b.KVUsage))
	case b.PrefillTokens > 0:
		ms = MockerPrefillMillis(b.PrefillTokens)
	case b.DecodeSeqs > 0:
		ms = MockerDecodeMillis(b.KVUsage)
	}
	return time.Duration(ms * float64(time.Millisecond))
}

// IterTimes names the iteration-time models a simulation can choose:
// "mocker" ([MockerIterTime], the default) and "mocker-fused"
// ([MockerFusedIterTime]).
var IterTimes = map[string]IterTimeFunc{
	"mocker":       MockerIterTime,
	"mocker-fused": MockerFusedIterTime,
}

// MockerPrefillMillis is the prefill part of [MockerIterTime] for t tokens,
// in milliseconds.
func MockerPrefillMillis(t int) float64 {
	x := float64(t)
	return 4.209989e-7*x*x + 1.518344e-2*x + mockerPrefillFixed
}

// MockerDecodeMillis is the decode part of [MockerIterTime] at active KV
// fraction u (clamped to [0, 1]), in milliseconds.
func MockerDecodeMillis(u float64) float64 {
	if math.IsNaN(u) || u < 0 {
		u = 0
	}
	u = min(u, 1)
	return max(1, -25.74*u*u+54.01*u+5.74)
}
