//go:build !race

package llmlb

const raceEnabled = false
