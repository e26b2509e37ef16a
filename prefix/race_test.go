//go:build race

package prefix

// raceEnabled reports whether the race detector is on; the slowest
// single-goroutine tests scale down under it, as it finds nothing there.
const raceEnabled = true
