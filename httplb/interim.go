package httplb

import (
	"context"
	"net/http/httptrace"
)

// withoutInterim returns ctx with its client trace, if it has one with a
// Got1xxResponse hook, replaced by a copy without that hook, so that no
// attempt reports its interim (1xx) answers to the caller. An attempt's
// 103 Early Hints may come from an endpoint that then fails and is
// retried, or from a hedge that loses, and its headers are the upstream's
// own (Server, a Link to the upstream's host, account headers) before
// anything could read them: httputil.ReverseProxy, and so [NewProxy],
// forwards every one it is told of to the client as it arrives. The
// caller's other hooks still see every attempt.
func withoutInterim(ctx context.Context) context.Context {
	trace := httptrace.ContextClientTrace(ctx)
	if trace == nil || trace.Got1xxResponse == nil {
		return ctx
	}
	kept := *trace
	kept.Got1xxResponse = nil
	return httptrace.WithClientTrace(hiddenTrace{ctx}, &kept)
}

// hiddenTrace is a context whose client trace is hidden: WithClientTrace
// on it does not compose with the parent's hooks.
type hiddenTrace struct{ context.Context }

func (c hiddenTrace) Value(key any) any {
	v := c.Context.Value(key)
	if _, ok := v.(*httptrace.ClientTrace); ok {
		return nil
	}
	return v
}
