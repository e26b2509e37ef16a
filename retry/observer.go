package retry

import "time"

// Observer holds functions that a [Loop], an [Admission] and an [Ejector]
// call on the events an operator watches: retries, hedges, refusals by the
// budget, ejections and admission refusals (package telemetry turns them
// into OpenTelemetry instruments). A nil field is skipped, and a component
// without an Observer does no work for it. One Observer may serve several
// components.
//
// The functions are called synchronously, on the goroutine of the event,
// outside the component's locks. They must be safe for concurrent use and
// must not block.
type Observer struct {
	// Retry is called once for each retry a [Loop] sends, as it is about
	// to send it: after its back-off wait, once its endpoint is picked.
	// A retry that the budget refuses (see Denied), whose context ends
	// during the wait, or that finds no endpoint to go to is never sent
	// and not counted. attempt is the retry's number within the request
	// (2 for the first retry) and cause the error of the failed attempt it
	// replaces.
	Retry func(attempt int, cause error)
	// Probe is called, instead of Retry, for each attempt that package
	// httplb sends to look for a stored response (OpenAI's Responses API)
	// on the next endpoint after the one before answered 404: such an
	// attempt follows no failure, though it is a retry for the budget.
	// attempt is its number within the request and cause the 404 of the
	// attempt before it.
	Probe func(attempt int, cause error)
	// Hedge is called when a [Loop] sends a hedge; attempt is its number.
	Hedge func(attempt int)
	// Denied is called once for each retry or hedge that a [Loop]'s
	// budget refuses. A retry is asked for before its back-off wait; a
	// hedge only once its endpoint is picked, so one with no endpoint to
	// go to is not counted.
	Denied func()
	// Eject is called when an [Ejector] ejects an endpoint, for d.
	Eject func(key string, d time.Duration)
	// Cooldown is called when an [Ejector] takes an endpoint out for d
	// because it answered an overload status asking for that wait: the
	// endpoint is out for d from the call, and the latest call for an
	// endpoint tells when it is due back, within a second. It is called again when a longer
	// wait asked of an endpoint already cooling down keeps it out longer,
	// for that wait. For an endpoint ejected at the time, whose ejection
	// such a wait does not lengthen, it is called when the wait outlasts
	// the ejection (or the cooldown due to follow it): the endpoint is out
	// for d from the call, ejected and then cooling down. A wait that ends
	// less than a second after the end of the endpoint's cooldown still
	// keeps it out until then but is not reported, so that a burst of
	// answers asking the same wait is reported once: the latest call may
	// be up to a second early.
	Cooldown func(key string, d time.Duration)
	// Reject is called when an [Admission] refuses a request.
	Reject func(err *OverloadError)
}

func (o *Observer) retry(attempt int, cause error) {
	if o != nil && o.Retry != nil {
		o.Retry(attempt, cause)
	}
}

func (o *Observer) hedge(attempt int) {
	if o != nil && o.Hedge != nil {
		o.Hedge(attempt)
	}
}

func (o *Observer) denied() {
	if o != nil && o.Denied != nil {
		o.Denied()
	}
}

func (o *Observer) eject(key string, d time.Duration) {
	if o != nil && o.Eject != nil {
		o.Eject(key, d)
	}
}

func (o *Observer) cooldown(key string, d time.Duration) {
	if o != nil && o.Cooldown != nil {
		o.Cooldown(key, d)
	}
}

func (o *Observer) reject(err *OverloadError) {
	if o != nil && o.Reject != nil {
		o.Reject(err)
	}
}
