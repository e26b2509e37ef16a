//go:build !race

package fair

const raceEnabled = false
