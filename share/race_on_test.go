//go:build race

package share

const raceEnabled = true
