package main

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// Bounds of flags beyond which the engine model (sim.Engine) or package
// share would refuse a run, or the simulator's arithmetic overflow; the
// command refuses them first, naming the flag. TestFlagLimits checks them
// against those packages.
const (
	maxKVBlocks     = 1 << 24 // KV blocks per replica
	maxAdapterSlots = 1 << 16 // LoRA adapter slots per replica

	maxDuration = time.Duration(math.MaxInt64)
	// maxInterval bounds -scrape and -signal-interval: the routers trust
	// an observation for three intervals, which must not overflow. With
	// -stagger, router k first scrapes at k intervals over the routers,
	// which bounds them further beyond four routers.
	maxInterval    = maxDuration / 3
	maxAdapterLoad = time.Minute // the stall of loading an adapter
	maxShare       = time.Minute // share.Config.Interval
	// maxShareSignalAge is share.Config.MaxSignalAge's bound: a Group
	// describes its requests' pick times over at most that long.
	maxShareSignalAge = 4 * time.Hour
)

// durationFlag is a flag.Value holding a duration, whose parse error names
// the flag and says what is wrong: a missing unit, a value beyond the
// range of time.Duration (stating the flag's range), or text that is no
// duration. It also records that error in *bad, so that the command can
// report it in its own words. Set checks no bound of a duration it
// parses: the command checks min and max after parsing.
type durationFlag struct {
	name     string
	d        *time.Duration
	min, max time.Duration
	zero     string // what 0 stands for, if the flag accepts it
	bad      *error
}

func (f durationFlag) String() string {
	if f.d == nil {
		return time.Duration(0).String()
	}
	return f.d.String()
}

func (f durationFlag) Set(s string) error {
	d, err := time.ParseDuration(s)
	if err != nil {
		reason := "want a duration, such as 2s or 500ms"
		if _, ferr := strconv.ParseFloat(strings.TrimSpace(s), 64); ferr == nil {
			reason = "a duration needs a unit, such as 2s or 500ms"
		} else if overflows(s) {
			reason = "out of range: " + f.want()
		}
		*f.bad = fmt.Errorf("invalid -%s %q: %s", f.name, s, reason)
		return errors.New(reason)
	}
	*f.d = d
	return nil
}

// want describes the values the flag accepts.
func (f durationFlag) want() string {
	s := fmt.Sprintf("want a duration from %s to %s", shortDuration(f.min), shortDuration(f.max))
	if f.zero != "" {
		s += ", or 0 for " + f.zero
	}
	return s
}

// overflows reports whether s is a well-formed duration too large for a
// time.Duration: [time.ParseDuration] rejects it, but accepts it with
// every digit zeroed, which changes its value and nothing else. (A lone
// digit, which becomes "0", is a number without a unit and is not asked
// about.)
func overflows(s string) bool {
	zeroed := strings.Map(func(r rune) rune {
		if r >= '0' && r <= '9' {
			return '0'
		}
		return r
	}, s)
	if _, err := time.ParseDuration(s); err == nil {
		return false
	}
	_, err := time.ParseDuration(zeroed)
	return err == nil
}

// shortDuration formats d as [time.Duration.String] does, without the
// zero minutes and seconds of a whole hour or minute: 1m, 1h20m, 4h.
func shortDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}
