// Package stamped lets a signal of this module tell the balancer that it
// stamps each observation with the time it records it, and whether it has
// recorded any.
package stamped

// Signal is implemented by an llmlb.Signal whose observations are stamped
// with the time they are recorded (their At), not with an earlier time of
// measurement. An observation of an endpoint that such a signal reports
// after one of its Loads found none was recorded after that Load, so a
// request picked while its endpoint had no observation counts in the next
// one: the balancer need not read the clock to tell.
type Signal interface {
	// Recorded reports whether the signal has recorded an observation of
	// any endpoint. Until it has, Load reports none; once it has, it
	// reports true ever after.
	Recorded(Token) bool
}

// Token is the argument of Signal's method. Only the packages of this
// module can name it, so only their signals implement Signal.
type Token struct{}
