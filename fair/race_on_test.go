//go:build race

package fair

const raceEnabled = true
