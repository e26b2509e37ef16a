package grpclb

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"

	"google.golang.org/grpc/balancer"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	v3orcapb "github.com/cncf/xds/go/xds/data/orca/v3"

	"github.com/llmlb/llmlb"
)

// Call metadata keys read when the call's context carries no [Call]. Values
// are decimal integers or strings; a malformed or out-of-range number is
// ignored (the field stays unknown) rather than failing the call. The keys
// are ordinary outgoing metadata, so the server receives them too.
const (
	// MetadataPromptTokens is the prompt length in tokens.
	MetadataPromptTokens = "x-llmlb-prompt-tokens"
	// MetadataMaxTokens is the output cap in tokens.
	MetadataMaxTokens = "x-llmlb-max-tokens"
	// MetadataOutputTokens is the caller's estimate of the output length.
	MetadataOutputTokens = "x-llmlb-output-tokens"
	// MetadataAffinityKey is the session or conversation key.
	MetadataAffinityKey = "x-llmlb-affinity-key"
	// MetadataTenant is the tenant.
	MetadataTenant = "x-llmlb-tenant"
)

// Call carries one RPC's routing facts to the balancer and its pick back to
// the caller. Attach it to the call's context with [WithCall]; the balancer
// picks with Request and stores the pick in the Call, so that a streaming
// caller can report the first token with [Call.FirstToken]. Use one Call per
// RPC and do not change Request once the RPC has started. When grpc retries
// an RPC (transparently, or by a retry policy), each attempt is picked anew
// and the Call holds the latest attempt's pick. FirstToken and Endpoint are
// safe to call from any goroutine while grpc picks; Request is not guarded,
// which is why it must not change once the RPC has started. A Call holds a
// lock: do not copy one after first use.
//
// grpc's picker cannot add values to the RPC's context, so a holder the
// caller creates is the only way back from the pick to the caller. A caller
// that never calls FirstToken loses nothing but precision: the request's
// prompt then counts as pending prefill until the RPC ends, which
// overestimates the endpoint's queued work during a long stream.
type Call struct {
	// Request is what is known about the RPC. Prefix (block hashes of the
	// prompt head, see package prefix) can only be given here, not in
	// metadata.
	Request llmlb.Request

	mu   sync.Mutex // protects pick and key
	pick llmlb.Pick
	key  string
}

// callKey is the context key of a Call. It is a pointer, which a context
// compares more cheaply than a struct on every pick.
var callKey = new(contextKey)

type contextKey struct{ _ byte }

// WithCall returns a copy of ctx that carries c. Start the RPC with it.
func WithCall(ctx context.Context, c *Call) context.Context {
	return context.WithValue(ctx, callKey, c)
}

// WithRequest returns a copy of ctx that carries r, for callers that do not
// report the first token. It is shorthand for WithCall(ctx, &Call{Request:
// *r}); a nil r is the zero Request.
func WithRequest(ctx context.Context, r *llmlb.Request) context.Context {
	c := new(Call)
	if r != nil {
		c.Request = *r
	}
	return WithCall(ctx, c)
}

// FirstToken records that the RPC's first token arrived: the endpoint's
// pending prefill work for the request is released (see llmlb.Pick). Call
// it when the first response message of a stream is received. It is a
// no-op before the RPC was picked, after it ended, and on a nil Call.
func (c *Call) FirstToken() {
	if c == nil {
		return
	}
	c.mu.Lock()
	p := c.pick
	c.mu.Unlock()
	p.FirstToken()
}

// Endpoint returns the key (address) of the endpoint the RPC was last
// picked for, or "" before the pick.
func (c *Call) Endpoint() string {
	if c == nil {
		return ""
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.key
}

func (c *Call) set(p llmlb.Pick, key string) {
	c.mu.Lock()
	c.pick, c.key = p, key
	c.mu.Unlock()
}

// picker picks with the channel's llmlb.Balancer, whose healthy members are
// the READY endpoints the program has not marked unhealthy (see
// lbBalancer.UpdateState). It is published while at least one endpoint is
// READY.
type picker struct {
	lb  *llmlb.Balancer
	rec *recorder
	// unready holds the members whose child was not READY when the
	// picker was built (see failed).
	unready []string
	// marked holds the members the program had marked unhealthy then.
	marked []string
	// pending holds the resolved endpoints that were not members then,
	// their first connection attempt since lb was built not yet READY,
	// with their children's pickers (see pendingError).
	pending []*endpoint
}

func (p *picker) Pick(info balancer.PickInfo) (balancer.PickResult, error) {
	ctx := info.Ctx
	if ctx == nil {
		ctx = context.Background()
	}
	var (
		pk   llmlb.Pick
		err  error
		call *Call
	)
	if call, _ = ctx.Value(callKey).(*Call); call != nil {
		pk, err = p.lb.Pick(ctx, &call.Request)
	} else if r := requestFromMetadata(ctx); r != nil {
		pk, err = p.lb.Pick(ctx, r)
		requestPool.Put(r)
	} else {
		pk, err = p.lb.Pick(ctx, nil)
	}
	if err != nil {
		if call != nil && len(p.pending) > 0 && errors.Is(err, llmlb.ErrNoCandidates) {
			if perr := p.pendingError(info, call.Request.Exclude); perr != nil {
				return balancer.PickResult{}, perr
			}
		}
		return balancer.PickResult{}, pickError(err)
	}
	ep, ok := pk.Endpoint().(*endpoint)
	if !ok {
		pk.Done(errNotSent)
		return balancer.PickResult{}, errForeign
	}
	res, err := ep.picker.Pick(info)
	if err != nil {
		// The RPC goes nowhere with this pick (grpc waits for another
		// picker or fails it): it neither succeeded nor failed at the
		// endpoint.
		pk.Done(errNotSent)
		if pk, ep, res, err = p.failed(ctx, info, call, ep, err); err != nil {
			return balancer.PickResult{}, err
		}
	}
	if call != nil {
		call.set(pk, ep.key)
	}
	d, _ := donePool.Get().(*pickDone)
	if d == nil {
		d = new(pickDone)
		d.done = d.finish
	}
	if ep.rpcs != nil {
		ep.rpcs.picked()
	}
	d.pk, d.rec, d.key, d.child, d.rpcs = pk, p.rec, ep.key, res.Done, ep.rpcs
	res.Done = d.done
	return res, nil
}

// failed handles the failure err of the child of ep, picked for the RPC of
// info (whose Call, if any, is call): it returns a pick of another member,
// or the error grpc is to see.
//
// A child that was not READY is picked only when every candidate is
// unhealthy (llmlb's panic mode: the program's marks or the request's
// Exclude leave no healthy one), or when a mark set directly on the balancer
// made it healthy since the last UpdateState, or when it is healthy while
// its child connects (with slow start, see lbBalancer.UpdateState). The RPC is
// then picked again without such members, so that it goes to a READY one
// if any is a candidate; for a fresh endpoint, only to a healthy one, since
// llmlb was not in panic mode. If that leaves no candidate while an
// endpoint that is not yet a member connects, the RPC waits for it (see
// pendingError). Otherwise the error stands: an RPC waits
// while the child connects, and fails unless it waits for ready while the
// child is in transient failure. A READY child whose picker fails has left READY since
// the last UpdateState: the RPC waits for the picker that is on its way.
func (p *picker) failed(ctx context.Context, info balancer.PickInfo, call *Call, ep *endpoint, err error) (llmlb.Pick, *endpoint, balancer.PickResult, error) {
	if !ep.ready && len(p.unready) > 0 {
		var r llmlb.Request
		if call != nil {
			r = call.Request
		} else if m := requestFromMetadata(ctx); m != nil {
			r = *m
			requestPool.Put(m)
		}
		r.Exclude = append(slices.Clip(r.Exclude), p.unready...)
		if ep.fresh {
			// ep is healthy: the RPC goes to a healthy READY member, or
			// waits for ep, rather than to one the program marked.
			r.Exclude = append(r.Exclude, p.marked...)
		}
		pk, perr := p.lb.Pick(ctx, &r)
		if perr == nil {
			again, ok := pk.Endpoint().(*endpoint)
			if !ok {
				pk.Done(errNotSent)
				return llmlb.Pick{}, nil, balancer.PickResult{}, errForeign
			}
			res, cerr := again.picker.Pick(info)
			if cerr == nil {
				return pk, again, res, nil
			}
			pk.Done(errNotSent)
		} else if len(p.pending) > 0 && errors.Is(perr, llmlb.ErrNoCandidates) &&
			errors.Is(p.pendingError(info, r.Exclude), balancer.ErrNoSubConnAvailable) {
			// An endpoint that is not yet a member connects: the RPC
			// waits for it, as it would with no member left.
			err = balancer.ErrNoSubConnAvailable
		}
	}
	if errors.Is(err, balancer.ErrNoSubConnAvailable) || ep.ready && status.Code(err) == codes.Unknown {
		err = balancer.ErrNoSubConnAvailable
	}
	return llmlb.Pick{}, nil, balancer.PickResult{}, err
}

// pendingError returns what grpc is to see for an RPC whose request
// excludes every member, or nil if it also excludes every pending endpoint
// (resolved, but not READY since lb was built, and so not a member): the RPC
// then fails. Otherwise it meets these endpoints as grpc-go's pickers meet
// their connections (balancer/pickfirst/pickfirst.go and
// balancer/endpointsharding/endpointsharding.go, grpc-go v1.85.0): it waits
// while one connects (or has just become READY, and joins with the next
// picker), and, while all are in TRANSIENT_FAILURE, fails unless it waits
// for ready, with the error of the first one's child.
func (p *picker) pendingError(info balancer.PickInfo, exclude []string) error {
	var first error
	for _, ep := range p.pending {
		if slices.Contains(exclude, ep.key) {
			continue
		}
		res, err := ep.picker.Pick(info)
		switch {
		case err == nil:
			if res.Done != nil {
				res.Done(balancer.DoneInfo{}) // not sent: see pickDone.finish
			}
			return balancer.ErrNoSubConnAvailable
		case errors.Is(err, balancer.ErrNoSubConnAvailable):
			return balancer.ErrNoSubConnAvailable
		case first == nil:
			first = err
		}
	}
	return first
}

// pickDone is the Done callback of one picked RPC. grpc calls a pick's Done
// at most once (when the RPC's attempt finishes, or when it discards the
// pick), so the callback and its state are pooled: finish puts them back,
// and a pick allocates nothing. A parent policy may call Done again (a defer
// beside an explicit call): finish ignores a call after the first, so that
// the pickDone goes back to the pool once, as long as the call comes before
// the pickDone serves another pick. A later one is a data race, which the
// race detector reports; it ends that other pick early (its counts still
// return to zero).
//
// A pickDone is padded to 128 bytes, a size class whose objects start on a
// cache line, so that the pickDones of RPCs on different processors never
// share a line.
type pickDone struct {
	pk    llmlb.Pick
	rec   *recorder
	key   string
	child func(balancer.DoneInfo) // the pick-first child's Done, if any
	done  func(balancer.DoneInfo) // d.finish, bound once
	rpcs  *rpcCount               // counts the RPC, if not nil
	_     [128 - 80]byte
}

// donePool holds free pickDones; Pick makes a new one when it is empty.
var donePool sync.Pool

func (d *pickDone) finish(di balancer.DoneInfo) {
	if d.rec == nil {
		return // called again: Pick sets rec, the first finish clears it
	}
	pk, rec, key, child, rpcs := d.pk, d.rec, d.key, d.child, d.rpcs
	d.pk, d.rec, d.key, d.child, d.rpcs = llmlb.Pick{}, nil, "", nil, nil
	donePool.Put(d)
	if r, ok := di.ServerLoad.(*v3orcapb.OrcaLoadReport); ok && r != nil {
		rec.record(key, r)
	}
	err := di.Err
	if err == nil && !di.BytesSent && !di.BytesReceived {
		// grpc discards a pick whose SubConn was no longer READY with a
		// zero DoneInfo and picks again: the RPC never reached the
		// endpoint, so it neither succeeded nor failed there.
		err = errNotSent
	}
	pk.Done(err)
	if rpcs != nil {
		rpcs.done(err)
	}
	if child != nil {
		child(di)
	}
}

// errNotSent ends the pick of an RPC that was not sent to its endpoint:
// grpc discarded the pick, or the endpoint's child picker failed (its
// SubConn is connecting, idle or in transient failure), so that grpc makes
// the RPC wait for another picker or fails it. It wraps
// [context.Canceled], which observers and outlier detection
// (retry.HealthOutcome) count as neither a success nor a failure of the
// endpoint: a SubConn's failure to connect is the channel's connectivity
// state, which already takes the endpoint out of the healthy ones, and is
// not counted again for every RPC that meets it. It wraps
// [llmlb.ErrNotSent] too, so that a prefix-aware policy forgets the prompt
// blocks it recorded at the endpoint for the pick.
var errNotSent error = newNotSent(fmt.Errorf("grpclb: pick discarded before the RPC was sent: %w", context.Canceled))

// notSent is an error that also wraps [llmlb.ErrNotSent], whose message it
// leaves out.
type notSent struct {
	error
	errs []error // llmlb.ErrNotSent, first for a short errors.Is, and error; built once
}

// newNotSent returns err wrapping [llmlb.ErrNotSent] as well.
func newNotSent(err error) error { return &notSent{err, []error{llmlb.ErrNotSent, err}} }

func (e *notSent) Unwrap() []error { return e.errs }

// errForeign fails an RPC whose pick is an endpoint the adapter did not
// add: the program replaced the members of the channel's llmlb.Balancer
// with Update, which Options.OnBalancer forbids. It is a status error, so
// grpc fails the RPC at once rather than waiting for another picker, until
// the adapter next sets the membership (when a connection changes state or
// the resolver updates) and so puts its own endpoints back.
var errForeign = status.Error(codes.Internal,
	"grpclb: the channel's llmlb.Balancer holds endpoints the adapter did not add: the program must not call its Update (see Options.OnBalancer)")

// pickError maps an llmlb.Pick error to what grpc expects of a picker.
func pickError(err error) error {
	switch {
	case errors.Is(err, llmlb.ErrNoEndpoints):
		// Membership is being replaced; wait for the next picker.
		return balancer.ErrNoSubConnAvailable
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return status.FromContextError(err).Err()
	case errors.Is(err, llmlb.ErrInvalidRequest):
		// InvalidArgument is reserved to the server; grpc would rewrite it.
		return status.Errorf(codes.Internal, "grpclb: %v", err)
	default: // ErrNoCandidates: the request excluded every endpoint
		return status.Errorf(codes.Unavailable, "grpclb: %v", err)
	}
}

// requestPool holds the requests read from metadata for the duration of a
// pick.
var requestPool = sync.Pool{New: func() any { return new(llmlb.Request) }}

// requestFromMetadata reads the request facts from the call's outgoing
// metadata into a request from requestPool; nil if none is present. It reads
// each key on its own: grpc copies only the values asked for, where it copies
// the whole metadata for metadata.FromOutgoingContext.
func requestFromMetadata(ctx context.Context) *llmlb.Request {
	var r *llmlb.Request
	set := func() *llmlb.Request {
		if r == nil {
			r = requestPool.Get().(*llmlb.Request)
			*r = llmlb.Request{}
		}
		return r
	}
	for _, f := range [...]struct {
		key string
		dst func(*llmlb.Request) *int
	}{
		{MetadataPromptTokens, func(r *llmlb.Request) *int { return &r.PromptTokens }},
		{MetadataMaxTokens, func(r *llmlb.Request) *int { return &r.MaxTokens }},
		{MetadataOutputTokens, func(r *llmlb.Request) *int { return &r.OutputTokens }},
	} {
		if v := metadata.ValueFromOutgoingContext(ctx, f.key); len(v) > 0 {
			if n, err := strconv.ParseInt(v[0], 10, 32); err == nil && n >= 0 {
				*f.dst(set()) = int(n)
			}
		}
	}
	if v := metadata.ValueFromOutgoingContext(ctx, MetadataAffinityKey); len(v) > 0 && v[0] != "" {
		set().AffinityKey = v[0]
	}
	if v := metadata.ValueFromOutgoingContext(ctx, MetadataTenant); len(v) > 0 && v[0] != "" {
		set().Tenant = v[0]
	}
	return r
}
