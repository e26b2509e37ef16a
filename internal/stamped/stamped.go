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

// Loader is implemented by a signal of this module that can find an
// endpoint once and then read its observations without looking it up by
// key again. L is llmlb.Load, which this package cannot name.
type Loader[L any] interface {
	// Loader returns a function that returns what the signal's Load(key)
	// would, or nil where Load would report none, or nil if the signal
	// has no function to give for key (the balancer then calls Load). The
	// observation it points to is not modified while the balancer reads
	// it: a signal shared between goroutines replaces observations
	// instead of writing into them.
	Loader(t Token, key string) func() *L
}

// Token is the argument of the methods of Signal and Loader. Only the
// packages of this module can name it, so only their signals implement
// them.
type Token struct{}
