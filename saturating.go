package llmlb

import "math"

// addSat returns a+b, saturating at math.MaxInt64 and math.MinInt64 instead
// of wrapping. Counts from outside the balancer (a Signal's observations)
// may be anything up to the maximum int; a wrapped sum would make the most
// loaded endpoint look idle.
func addSat(a, b int64) int64 {
	s := a + b
	if (s > a) != (b > 0) { // overflowed
		if b > 0 {
			return math.MaxInt64
		}
		return math.MinInt64
	}
	return s
}

// mulSat returns a*b for non-negative a and b, saturating at math.MaxInt.
func mulSat(a, b int) int {
	if a == 0 || b == 0 {
		return 0
	}
	if a > math.MaxInt/b {
		return math.MaxInt
	}
	return a * b
}
