//go:build race

package httplb

// raceEnabled reports whether the race detector is on. Its runtime allocates
// differently (sync.Pool drops items at random), so allocation tests skip.
const raceEnabled = true
