// Package model is the continuous-batching engine model that the simulator
// (package sim) and the engine emulator (package engine) share: a [Replica]
// schedules [Sequence]s in iterations within a token budget, a batch limit
// and a KV cache of blocks with prefix caching, evicting least recently used
// cached blocks and preempting the newest sequence when blocks run out; an
// [IterTimeFunc] says how long each iteration takes. It imports nothing but
// the standard library, so that the emulator does not build the simulator.
package model
