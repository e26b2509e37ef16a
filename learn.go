package llmlb

import (
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// The constants of the speed estimates (see
// [DefaultConfig].DisableLearning). They set how fast an estimate forgets
// and how much evidence it needs, not what a token costs: that is what is
// learned.
const (
	// learnWindow is the memory of a fit, in observations: each new one
	// weighs 1/learnWindow of the sums, older ones decay geometrically.
	learnWindow = 256
	// learnPrior is the weight, in observations, of the prior (the pool's
	// average speed) against an endpoint's own fit: with n observations an
	// endpoint's slowness moves n/(n+learnPrior) of the way from 1 to its
	// fit.
	learnPrior = 8
	// learnHalfLife is the half-life of the evidence of an endpoint that
	// gets no new observations: an endpoint judged slow and therefore
	// avoided drifts back to the pool's average, gets traffic again and is
	// measured anew (see silence).
	learnHalfLife = 30 * time.Second
	// learnSilence is how many times its mean interval between
	// observations an endpoint must go without one, beyond learnHalfLife,
	// for its evidence to age (see silence); learnGapWindow is about how
	// many intervals that mean reflects.
	learnSilence   = 8.0
	learnGapWindow = 32.0
	// learnClamp bounds an observation of a warm endpoint to within this
	// many mean absolute deviations of its prediction (on a log scale), so
	// that a request stuck behind a preemption or a lost cache (the tail)
	// moves the fit little more than an ordinary one; a deviation counts
	// in the mean as at most a factor of learnMaxClamp.
	learnClamp    = 3.0
	learnMaxClamp = 4.0
	// learnMinDev is the least deviation the clamp and the standard
	// errors allow, and learnInitDev the deviation the clamp assumes
	// before measuring any, on a log scale.
	learnMinDev  = 0.05
	learnInitDev = 0.25
	// learnWarm is the observations from which the clamp applies.
	learnWarm = 4
	// learnUneven and learnOutlier set when a pool's speeds count as
	// different (see poolSpeed.test): when the fits' squared deviations
	// from the pool, in standard errors, average above learnUneven, or
	// one exceeds learnOutlier times the log of their number. On the
	// simulator's training runs (seeds 1 and 5 of the default, prefixes,
	// mixed and mixed-slowdown scenarios, 16 fits a pick) equal replicas
	// never averaged above 3.3 nor reached a square of 24 (the outlier
	// bound is 33), and 512 equal replicas behind 16 routers never tested
	// uneven in 30,000 requests; unequal ones tested uneven at 99% of the
	// tests of the mixed scenario, their mean square reaching 53-68.
	learnUneven  = 8.0
	learnOutlier = 12.0
	// learnRecheck is how long a test that found a pool's speeds even
	// stands: picks in between price without reading any estimate.
	learnRecheck = 10 * time.Millisecond
	// learnMaxSlowness bounds an endpoint's slowness relative to the pool,
	// and its inverse, so that no estimate prices an endpoint out entirely.
	learnMaxSlowness = 16.0
	// logMaxSlowness is the log of learnMaxSlowness.
	logMaxSlowness = 2.772588722239781
	// learnMaxSeconds and learnMaxWork bound the inputs of an observation:
	// larger values are clamped, so that the sums stay finite.
	learnMaxSeconds = 1e6
	// learnMinTau is the least slope of a fit, in seconds per token: a
	// positive slope marks an estimate as fitted.
	learnMinTau  = 1e-15
	learnMaxWork = 1e12
)

// speedEstimate is the online estimate of one endpoint's speed, fed by this
// balancer's own requests to it. Its prefill part fits
//
//	TTFT = a + tau * work
//
// by weighted least squares over geometrically decayed sums (each
// observation weighted by the inverse square of its work plus the mean work,
// since the noise of a TTFT grows with it), where work is what the
// policy priced as the request's wait for its first token, in prefill tokens
// (the queued prefill in front of it, the waiting requests at the mean prompt
// length, and its own uncached prompt), and TTFT the time from the pick to
// the first token. Its decode part is the ratio of decayed sums of the time
// from the first token to Done and of the request's expected decode tokens.
//
// Updates take mu; the pick path reads only the published atomics, which may
// be torn between fields without harm.
type speedEstimate struct {
	mu sync.Mutex // protects the sums below
	// Prefill sums: weight, work, TTFT (s), work^2, work*TTFT; the
	// decayed count of observations and the mean work.
	n, sw, sy, sww, swy float64
	c, mw               float64
	// Decode sums: weight, seconds, tokens.
	dn, dy, dt float64
	// Load sums of the decode (see done), each observation weighted by its
	// tokens: weight, load, log seconds per token, load^2, load*log
	// seconds per token.
	ln, ll, ly, lll, lly float64
	// dev and ddev are the mean absolute log ratios of observation to
	// prediction, prefill and decode, for the clamp.
	dev, ddev float64
	// gap and dgap are the mean intervals between observations, prefill
	// and decode, in nanoseconds (see silence); 0 before the second.
	gap, dgap float64

	// Published for the pick path, float64 bits unless noted.
	a, tau atomic.Uint64 // intercept (s) and slope (s per token); tau 0 = no fit
	se     atomic.Uint64 // relative standard error of the fit's predictions
	count  atomic.Uint64 // c
	at     atomic.Int64  // unix nanos of the last prefill observation
	dtau   atomic.Uint64 // decode seconds per expected token; 0 = no fit
	dlog   atomic.Uint64 // the log of dtau, once dtau is set
	dse    atomic.Uint64 // its relative standard error
	dcount atomic.Uint64 // dn
	dat    atomic.Int64  // unix nanos of the last decode observation
	// The load sums' means and moments per unit weight: load, log seconds
	// per token, their covariance and the load's variance, published once
	// loaded is set (a decode with a known load observed).
	lload, llog, lcov, lvar atomic.Uint64
	loaded                  atomic.Bool

	// area is the sum over this balancer's requests to the endpoint of
	// their tokens times the time (areaTime) they were charged, less the
	// same at their release (see epState.loadArea).
	area atomic.Int64
}

// firstToken folds in one request's time to first token: work prefill tokens
// priced at the pick, ttft from the pick to the first token, observed at now
// (unix nanos). Inputs that are negative or not numbers are ignored; huge
// ones are clamped.
func (e *speedEstimate) firstToken(work float64, ttft time.Duration, now int64) {
	y := ttft.Seconds()
	if !(work >= 0) || !(y >= 0) {
		return
	}
	work, y = min(work, learnMaxWork), min(y, learnMaxSeconds)
	e.mu.Lock()
	defer e.mu.Unlock()
	f := 1.0 // the weight the evidence keeps (see silence)
	if e.c > 0 {
		f = silence(&e.gap, e.at.Load(), now)
	}
	if e.c >= learnWarm {
		a, tau := math.Float64frombits(e.a.Load()), math.Float64frombits(e.tau.Load())
		if f < 1 {
			y = bound(y, a+tau*work)
		} else {
			y = winsorize(y, a+tau*work, &e.dev, e.c)
		}
	}
	if f < 1 {
		e.c *= f
		e.n, e.sw, e.sy, e.sww, e.swy = e.n*f, e.sw*f, e.sy*f, e.sww*f, e.swy*f
	}
	w := 1.0
	keep := 1 - 1.0/learnWindow
	// The noise of a TTFT grows with it: weigh each observation by the
	// inverse square of its work plus the mean work, a proxy for its
	// prediction that does not depend on the fit.
	if e.c == 0 {
		e.mw = work
	}
	e.mw += (work - e.mw) / learnWindow
	if e.mw > 0 {
		r := 2 * e.mw / (work + e.mw)
		w *= r * r
	}
	e.c = e.c*keep + 1
	e.n = e.n*keep + w
	e.sw = e.sw*keep + w*work
	e.sy = e.sy*keep + w*y
	e.sww = e.sww*keep + w*work*work
	e.swy = e.swy*keep + w*work*y
	a, tau := fitLine(e.n, e.sw, e.sy, e.sww, e.swy)
	e.a.Store(math.Float64bits(a))
	e.tau.Store(math.Float64bits(tau))
	e.se.Store(math.Float64bits(stdErr(e.dev, e.c)))
	e.count.Store(math.Float64bits(e.c))
	e.at.Store(now)
}

// stdErr returns the relative standard error of a fit of n observations
// whose mean absolute deviation from their predictions, on a log scale, is
// dev: dev*sqrt(pi/2) is the standard deviation of normal errors. The
// deviation counts as at least learnMinDev, so that fits of nearly
// constant times do not count rounding as a difference. Before a deviation
// is measured (dev 0: winsorize measures it from the first observation
// that finds learnWarm before it, a fit's sixth) it returns 0: the fit has
// no standard error yet, and the test of the pool leaves it out.
// (A young fit's error would be a guess, and the guess is too small: a
// line through one or two requests extrapolates to this pick's work far
// beyond it. Behind 16 routers sharing 512 equal replicas, each router's
// young fits made the test find the pool uneven at half its picks.)
func stdErr(dev, n float64) float64 {
	if dev == 0 {
		return 0
	}
	return max(dev, learnMinDev) * math.Sqrt(math.Pi/2) / math.Sqrt(max(n, 1))
}

// winsorize returns y bounded to within learnClamp mean absolute
// deviations (at least learnMinDev) of the prediction pred, on a log scale,
// and folds the distance of y, capped at a factor of learnMaxClamp, into
// *dev, the estimate having n observations before this one. The first
// deviations are averaged (with learnInitDev counting as one), the later
// ones weigh 1/32 each, so that the deviation, and the standard error it
// gives the test of the pool, are not a guess while the fit is young. A
// zero y or pred passes unchanged.
func winsorize(y, pred float64, dev *float64, n float64) float64 {
	if !(y > 0) || !(pred > 0) || math.IsInf(pred, 0) {
		return y
	}
	if *dev == 0 {
		*dev = learnInitDev
	}
	l := math.Log(y / pred)
	limit := max(learnClamp**dev, learnMinDev)
	*dev += (min(math.Abs(l), math.Log(learnMaxClamp)) - *dev) / min(max(n-learnWarm+2, 2), 32)
	return pred * math.Exp(min(max(l, -limit), limit))
}

// bound returns y bounded to within a factor of learnMaxClamp of the
// prediction pred: an observation that ends a silence (see silence), which
// counts beside evidence aged to little and may be what the endpoint is now,
// rather than the tail winsorize bounds, but is not let take the place of
// the fit whatever it measured (a clock read far ahead at the first token).
// A zero y or pred passes unchanged.
func bound(y, pred float64) float64 {
	if !(y > 0) || !(pred > 0) || math.IsInf(pred, 0) {
		return y
	}
	return min(max(y, pred/learnMaxClamp), pred*learnMaxClamp)
}

// fitLine returns the least-squares line y = a + tau*w of the sums, with a
// and tau non-negative: flat (tau the least positive slope, a the mean) when
// the free fit's slope is negative, since the works then explain nothing;
// through the origin when the works hardly vary or the free fit has a
// negative intercept. It returns tau 0 when nothing can be fitted (every
// work zero).
func fitLine(n, sw, sy, sww, swy float64) (a, tau float64) {
	mw, my := sw/n, sy/n
	vw := sww/n - mw*mw
	cw := swy/n - mw*my
	if vw > 1e-4*mw*mw {
		if !(cw > 0) {
			if my > 0 && !math.IsInf(my, 0) {
				return min(my, learnMaxSeconds), learnMinTau
			}
		} else {
			tau = cw / vw
			a = my - tau*mw
		}
	}
	if !(tau > 0) || !(a >= 0) || math.IsInf(tau, 0) || math.IsInf(a, 0) {
		a, tau = 0, 0
		if sww > 0 {
			tau = swy / sww
		}
	}
	if !(tau > 0) || math.IsInf(tau, 0) {
		// No slope: every work was zero. The mean TTFT is the intercept,
		// but without a slope the endpoint stays unpriced.
		return 0, 0
	}
	return min(a, learnMaxSeconds), min(max(tau, learnMinTau), learnMaxSeconds)
}

// done folds in one request's decode: d from its first token to Done, over
// tokens expected decode tokens, observed at now, with load tokens of this
// balancer's requests outstanding at the endpoint on average meanwhile
// (negative if unknown).
//
// Besides the ratio of seconds to tokens, it keeps the moments of the log
// of the seconds per token against the load, from which the pool compares
// endpoints at the same load (see poolSpeed.slowness): an endpoint's time
// per token grows with the tokens it holds, and a policy that sends more
// work to the faster endpoints would otherwise measure them slower than
// they are.
func (e *speedEstimate) done(d time.Duration, tokens int64, now int64, load float64) {
	y := d.Seconds()
	if tokens <= 0 || !(y >= 0) {
		return
	}
	y = min(y, learnMaxSeconds)
	x := min(float64(tokens), learnMaxWork)
	e.mu.Lock()
	defer e.mu.Unlock()
	f := 1.0 // the weight the evidence keeps (see silence)
	if e.dn > 0 {
		f = silence(&e.dgap, e.dat.Load(), now)
	}
	if e.dn >= learnWarm && e.dt > 0 {
		if f < 1 {
			y = bound(y, e.dy/e.dt*x)
		} else {
			y = winsorize(y, e.dy/e.dt*x, &e.ddev, e.dn)
		}
	}
	if f < 1 {
		e.dn, e.dy, e.dt = e.dn*f, e.dy*f, e.dt*f
		e.ln, e.ll, e.ly, e.lll, e.lly = e.ln*f, e.ll*f, e.ly*f, e.lll*f, e.lly*f
	}
	keep := 1 - 1.0/learnWindow
	e.dn = e.dn*keep + 1
	e.dy = e.dy*keep + y
	e.dt = e.dt*keep + x
	tau := 0.0
	if e.dt > 0 && e.dy > 0 {
		tau = min(max(e.dy/e.dt, learnMinTau), learnMaxSeconds)
	}
	if tau > 0 {
		e.dlog.Store(math.Float64bits(math.Log(tau)))
	}
	e.dtau.Store(math.Float64bits(tau))
	if load >= 0 && y > 0 {
		load = min(load, learnMaxWork)
		ly := math.Log(y / x)
		e.ln = e.ln*keep + x
		e.ll = e.ll*keep + x*load
		e.ly = e.ly*keep + x*ly
		e.lll = e.lll*keep + x*load*load
		e.lly = e.lly*keep + x*load*ly
		ml, my := e.ll/e.ln, e.ly/e.ln
		e.lload.Store(math.Float64bits(ml))
		e.llog.Store(math.Float64bits(my))
		e.lcov.Store(math.Float64bits(e.lly/e.ln - ml*my))
		e.lvar.Store(math.Float64bits(max(e.lll/e.ln-ml*ml, 0)))
		e.loaded.Store(true)
	}
	e.dse.Store(math.Float64bits(stdErr(e.ddev, e.dn)))
	e.dcount.Store(math.Float64bits(e.dn))
	e.dat.Store(now)
}

// speedView is what one pick reads of a candidate's estimate: its fits, the
// confidence g and dg in [0, 1) each earned from its decayed observation
// count (learnPrior) and their age (learnHalfLife), 0 for a cold endpoint,
// its declared weight, and the work priced for the pick.
type speedView struct {
	a, tau, g, se float64
	dtau, dg, dse float64
	dlog          float64 // the log of dtau
	// The decode's load moments (speedEstimate.lload and the others);
	// loaded is set when they are known.
	lload, llog, lcov, lvar float64
	loaded                  bool
	weight                  float64
	work                    float64
}

// confidence returns n/(n+learnPrior) with n the count decayed by the age of
// its last observation.
func confidence(count float64, at, now int64) float64 {
	if !(count > 0) {
		return 0
	}
	if age := now - at; age > 0 {
		count *= math.Exp2(-float64(age) / float64(learnHalfLife))
	}
	return count / (count + learnPrior)
}

// silence returns the weight the evidence of an estimate keeps when an
// observation comes at now after its last one at at, and folds the
// interval into *gap, the mean interval between its observations. An
// interval longer than learnHalfLife and than learnSilence times the mean
// is a silence: the endpoint was not used, as one avoided for being slow is
// not, and its evidence has aged, as the confidence read it meanwhile,
// for the time beyond both; the observation that ends the silence must not
// bring it back at its full weight, or the endpoint would be priced by what
// it was before the silence, as soon as it is tried again. An endpoint in
// steady use, however light, keeps its evidence: the window forgets it.
func silence(gap *float64, at, now int64) float64 {
	d := float64(now) - float64(at) // no overflow
	if !(d > 0) {
		return 1
	}
	m := *gap
	if m == 0 {
		*gap = d
		return 1
	}
	*gap = m + (d-m)/learnGapWindow
	beyond := d - max(float64(learnHalfLife), learnSilence*m)
	if !(beyond > 0) {
		return 1
	}
	return math.Exp2(-beyond / float64(learnHalfLife))
}

// stampAt returns the time of the last observation stamped in at, read at
// now: a stamp far ahead of now (see maxAhead) is moved back to now, so that
// the evidence ages from now on rather than not at all until the clock
// catches up.
func stampAt(at *atomic.Int64, now int64) int64 {
	t := at.Load()
	if ahead(t, now) {
		at.CompareAndSwap(t, now)
		return now
	}
	return t
}

// load reads e into v at now.
func (v *speedView) load(e *speedEstimate, weight float64, now int64) {
	*v = speedView{weight: weight}
	if e == nil {
		return
	}
	if tau := math.Float64frombits(e.tau.Load()); tau > 0 {
		v.a, v.tau = math.Float64frombits(e.a.Load()), tau
		v.g = confidence(math.Float64frombits(e.count.Load()), stampAt(&e.at, now), now)
		v.se = math.Float64frombits(e.se.Load())
	}
	if dtau := math.Float64frombits(e.dtau.Load()); dtau > 0 {
		v.dtau = dtau
		v.dlog = math.Float64frombits(e.dlog.Load())
		v.dg = confidence(math.Float64frombits(e.dcount.Load()), stampAt(&e.dat, now), now)
		v.dse = math.Float64frombits(e.dse.Load())
		if e.loaded.Load() {
			v.loaded = true
			v.lload = math.Float64frombits(e.lload.Load())
			v.llog = math.Float64frombits(e.llog.Load())
			v.lcov = math.Float64frombits(e.lcov.Load())
			v.lvar = math.Float64frombits(e.lvar.Load())
		}
	}
}

// poolSpeed is the confidence-weighted mean fit of the candidates of one
// pick. A cold endpoint is assumed to run at this speed times its declared
// weight. The fits are measured speeds, not speeds per unit of weight: a
// measurement replaces the weight (see [defaultPolicy.cost]).
type poolSpeed struct {
	g, a, tau float64 // sums of g, g*a, g*tau
	dg, dtau  float64 // sums of dg, dg*dtau
	// Sums of dg and of dg times the decode's load moments, over the
	// candidates whose moments are known.
	lg, lload, llog, lcov, lvar float64
	// The same sums over the fits with a standard error, those test
	// compares.
	sg, sa, stau       float64
	sdg, sdtau         float64
	slg, slload, sllog float64
	// uneven is set by test: the candidates' speeds differ by more than
	// their estimates' noise.
	uneven bool
	// weighted is set by add: a candidate declares a weight other than 1.
	weighted bool
}

// learned reports whether the candidates' speeds differ measurably: some
// candidate has a fit and test found the pool uneven.
func (p *poolSpeed) learned() bool { return p.uneven && (p.g > 0 || p.dg > 0) }

// test sets p.uneven: whether the candidates' measured speeds differ more
// than their noise explains. For each fit with a standard error it takes
// the log of the ratio the price would use, bounded as the price bounds it
// and moved by the fit's confidence, in standard errors of the fit: the
// standard error is a deviation on a log scale, so the difference counts
// as a log ratio, not a relative one, for the prefill as for the decode.
// The pool is uneven when the mean square of these exceeds learnUneven, or
// the largest square exceeds learnOutlier times the log of their number
// (one slow replica among many). On equal replicas the differences are
// noise (and what transient load makes of the fits): pricing them would
// move requests at random and cost a little, so an even pool is priced as
// without learning.
//
// The prefill ratio is the candidate's prediction for work prefill tokens
// over the pool's mean prediction, as the price has it. (As a relative
// difference, a young fit that had seen only short prompts, extrapolated
// to this pick's work, read 4 to 6 times the pool: behind 16 routers
// sharing 512 equal replicas, each router's fits are young, and the test
// found the pool uneven at one test in twelve.) Decode times are compared
// at equal load, as slowness prices them: a policy that sends the faster
// endpoints more work makes their raw times per token alike, and a test of
// the raw times would then find the pool even and stop the pricing that
// made them so. Like the price, the test compares each endpoint's mean log
// time per token, less the pool's rate of growth with the load times its
// mean load, with the mean of the same over the fits tested. (As a
// relative difference, a few young fits of widely spread times, whose logs
// pull the reference down, made an ordinary fit look 3 to 4 times slower
// than the pool: on the Mooncake trace at equal speeds that opened the
// test early in every run.)
//
// The candidates are vs[i] for i in pick, or every element of vs when pick
// is nil.
func (p *poolSpeed) test(vs []speedView, pick []int32, work float64) {
	p.uneven = false
	if p.g == 0 && p.dg == 0 {
		return
	}
	// The reference is the mean of the fits tested, so that a young fit
	// does not move it either.
	var pre, dec float64
	if p.sg > 0 {
		pre = (p.sa + p.stau*work) / p.sg
	}
	if p.sdg > 0 {
		dec = p.sdtau / p.sdg
	}
	beta, loaded := p.beta(), 0.0
	if p.slg > 0 {
		loaded = (p.sllog - beta*p.slload) / p.slg
	}
	sum, most, n := 0.0, 0.0, 0
	add := func(v *speedView) {
		if v.g > 0 && pre > 0 && v.se > 0 {
			z := v.g * math.Log(boundSlowness((v.a+v.tau*work)/pre)) / v.se
			sum += z * z
			most = max(most, z*z)
			n++
		}
		if v.dg > 0 && dec > 0 && v.dse > 0 {
			var l float64 // the log of the ratio, bounded as boundSlowness
			if v.loaded && p.slg > 0 {
				l = min(max(v.llog-beta*v.lload-loaded, -logMaxSlowness), logMaxSlowness)
			} else {
				l = math.Log(boundSlowness(v.dtau / dec))
			}
			z := v.dg * l / v.dse
			sum += z * z
			most = max(most, z*z)
			n++
		}
	}
	if pick == nil {
		for i := range vs {
			add(&vs[i])
		}
	} else {
		for _, i := range pick {
			add(&vs[i])
		}
	}
	// Deviations from the pool's mean have one degree of freedom fewer
	// than the candidates; an endpoint alone is compared with itself. The
	// largest of n noisy squares grows as log n.
	p.uneven = n > 1 && (sum > learnUneven*float64(n-1) || most > learnOutlier*math.Log(float64(n)))
}

func (p *poolSpeed) add(v *speedView) {
	if v.weight != 1 {
		p.weighted = true
	}
	if v.g > 0 {
		p.g += v.g
		p.a += v.g * v.a
		p.tau += v.g * v.tau
		if v.se > 0 {
			p.sg += v.g
			p.sa += v.g * v.a
			p.stau += v.g * v.tau
		}
	}
	if v.dg > 0 {
		p.dg += v.dg
		p.dtau += v.dg * v.dtau
		if v.loaded {
			p.lg += v.dg
			p.lload += v.dg * v.lload
			p.llog += v.dg * v.llog
			p.lcov += v.dg * v.lcov
			p.lvar += v.dg * v.lvar
		}
		if v.dse > 0 {
			p.sdg += v.dg
			p.sdtau += v.dg * v.dtau
			if v.loaded {
				p.slg += v.dg
				p.slload += v.dg * v.lload
				p.sllog += v.dg * v.llog
			}
		}
	}
}

// slowness returns how many times longer than the pool's average candidate
// v takes to reach its first token with work tokens to prefill, and to
// decode a token at the same load: 1 + g*(fit/pool - 1), bounded to
// [1/learnMaxSlowness, learnMaxSlowness], and exactly 1 for an endpoint
// without observations.
//
// The decode comparison is at equal load. Each endpoint's log seconds per
// token is taken to grow with the tokens it holds at one rate for the pool,
// beta, estimated from how the times vary with the load within each
// endpoint (the confidence-weighted within-endpoint covariance over the
// variance); an endpoint's slowness is then exp of its mean log time, less
// beta times its mean load, minus the pool's mean of the same. Without
// load moments it falls back on the ratio of mean seconds per token.
func (p *poolSpeed) slowness(v *speedView, work float64) (prefill, decode float64) {
	prefill, decode = 1, 1
	if v.g > 0 && p.g > 0 {
		pool := (p.a + p.tau*work) / p.g
		own := v.a + v.tau*work
		if r := own / pool; r > 0 && !math.IsInf(r, 0) {
			prefill = 1 + v.g*(boundSlowness(r)-1)
		}
	}
	if v.dg > 0 && p.dg > 0 {
		r := v.dtau * p.dg / p.dtau
		if v.loaded && p.lg > 0 {
			beta := p.beta()
			own := v.llog - beta*v.lload
			pool := (p.llog - beta*p.lload) / p.lg
			r = math.Exp(own - pool)
		}
		if r > 0 && !math.IsInf(r, 0) {
			decode = 1 + v.dg*(boundSlowness(r)-1)
		}
	}
	return prefill, decode
}

// beta returns the pool's rate of growth of the log of the time per decode
// token with the load: the confidence-weighted within-endpoint covariance
// over the variance, 0 when the loads do not vary. A load never speeds
// decoding up.
func (p *poolSpeed) beta() float64 {
	if p.lvar > 0 {
		return max(p.lcov/p.lvar, 0)
	}
	return 0
}

// boundSlowness bounds a ratio of an endpoint's fit to the pool's to
// [1/learnMaxSlowness, learnMaxSlowness].
func boundSlowness(r float64) float64 {
	return min(max(r, 1/learnMaxSlowness), learnMaxSlowness)
}

func growSpeeds(s []speedView, n int) []speedView {
	if cap(s) < n {
		return make([]speedView, n)
	}
	return s[:n]
}
