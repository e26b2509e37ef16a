// The demo -demo-fair, and nothing of the gateway itself: like every demo*.go
// file, it is left out of a copy of the gateway (demo.go says why).

package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/llmlb/llmlb/engine"
	"github.com/llmlb/llmlb/internal/e2e"
)

// The cluster of -demo-fair: fairDemoEngines emulated engines configured
// by fairDemoEngine, 4 batch slots each and four times faster than the
// model's real time, so that a heavy tenant's backlog alone exceeds their
// capacity.
const fairDemoEngines = 2

var fairDemoEngine = engine.Config{MaxRunning: 4, KVBlocks: 512, Speedup: 4}

// fairLoad is the load of one -demo-fair run: a heavy tenant that keeps
// Heavy requests outstanding (a closed loop of Heavy clients) and a light
// tenant that sends Light requests one at a time, starting HeadStart after
// the heavy one so that its backlog is in place. The run ends when the
// light tenant's last request has ended; the heavy tenant's requests still
// in flight are then cancelled.
type fairLoad struct {
	// Heavy is the heavy tenant's requests outstanding; Light the number
	// of requests of the light tenant.
	Heavy, Light int
	// HeadStart is the heavy tenant's lead.
	HeadStart time.Duration
	// Header is the trusted header that carries the tenant.
	Header string
	// Seed makes the prompts and output lengths deterministic.
	Seed uint64
	// Timeout bounds the run; the requests still in flight then fail.
	Timeout time.Duration
}

// The tenants of -demo-fair.
const (
	heavyTenant = "heavy"
	lightTenant = "light"
)

// fairRequest returns the workload of one request of either tenant, drawn
// from seed: a 320-token prompt of random words and 32 to 64 output tokens.
func fairRequest(seed uint64) e2e.Workload {
	return e2e.Workload{
		Requests:    1,
		Rate:        1e9, // sent at once
		Groups:      1,
		PrefixBytes: 256 * engine.BytesPerToken,
		SuffixBytes: 64 * engine.BytesPerToken,
		Short:       [2]int{32, 64},
		LongShare:   -1,
		Seed:        seed,
	}
}

// tenantTransport sets the tenant header on every request, as the trusted
// proxy in front of a gateway would.
type tenantTransport struct {
	base           http.RoundTripper
	header, tenant string
}

// RoundTrip sends a copy of r with the tenant header set.
func (t *tenantTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set(t.header, t.tenant)
	return t.base.RoundTrip(r)
}

// fairResult is what the two tenants saw in one run.
type fairResult struct {
	// Heavy and Light are the tenants' outcomes, in the order they ended.
	Heavy, Light e2e.Result
	// Elapsed is the run's wall-clock time, the head start included.
	Elapsed time.Duration
}

// tokens returns the output tokens streamed to the clients of r, those of
// unfinished requests included.
func tokens(r *e2e.Result) int {
	n := 0
	for i := range r.Outcomes {
		n += r.Outcomes[i].Got
	}
	return n
}

// lightShare returns the light tenant's share of the output tokens streamed
// in the run, from 0 to 1.
func (r *fairResult) lightShare() float64 {
	l, h := tokens(&r.Light), tokens(&r.Heavy)
	if l+h == 0 {
		return 0
	}
	return float64(l) / float64(l+h)
}

// fairRun starts the -demo-fair cluster and a gateway configured by o in
// front of it, sends it load over loopback and returns what each tenant saw.
func fairRun(o options, load fairLoad) (fairResult, error) {
	o.tenantHeader = load.Header
	_, base, stop, err := startDemo(o, fairDemoEngines, fairDemoEngine)
	if err != nil {
		return fairResult{}, err
	}
	defer stop()
	client := func(tenant string) *http.Client {
		return &http.Client{Transport: &tenantTransport{
			base:   &http.Transport{MaxIdleConnsPerHost: 64},
			header: load.Header,
			tenant: tenant,
		}}
	}
	heavy, light := client(heavyTenant), client(lightTenant)
	defer heavy.CloseIdleConnections()
	defer light.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(context.Background(), load.Timeout)
	defer cancel()
	heavyCtx, stopHeavy := context.WithCancel(ctx)
	defer stopHeavy()

	var res fairResult
	start := time.Now()
	heavyDone := make(chan struct{})
	go func() {
		defer close(heavyDone)
		res.Heavy = closedLoop(heavyCtx, heavy, base, load.Heavy, 0, load.Seed)
	}()
	timer := time.NewTimer(load.HeadStart)
	select {
	case <-timer.C:
	case <-ctx.Done():
		timer.Stop()
	}
	res.Light = closedLoop(ctx, light, base, 1, load.Light, load.Seed+1<<48)
	stopHeavy()
	<-heavyDone
	res.Elapsed = time.Since(start)
	return res, nil
}

// closedLoop sends requests from clients goroutines, each sending its next
// request when its last one ends, until it has sent each requests (0: no
// limit) or ctx is done, and returns their outcomes, each client's in the
// order sent. The request k of client c is fairRequest(seed + c<<32 + k).
func closedLoop(ctx context.Context, client *http.Client, base string, clients, each int, seed uint64) e2e.Result {
	var (
		wg  sync.WaitGroup
		mu  sync.Mutex // protects res
		res e2e.Result
	)
	start := time.Now()
	for c := range clients {
		wg.Go(func() {
			for k := 0; (each == 0 || k < each) && ctx.Err() == nil; k++ {
				r := e2e.Generate(ctx, client, base, fairRequest(seed+uint64(c)<<32+uint64(k)))
				o := r.Outcomes[0]
				if o.Status == 0 && ctx.Err() != nil {
					break // not answered: the loop was stopped
				}
				mu.Lock()
				res.Outcomes = append(res.Outcomes, o)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	res.Elapsed = time.Since(start)
	return res
}

// fairDemoLoad is the load of -demo-fair.
var fairDemoLoad = fairLoad{
	Heavy:     16,
	Light:     20,
	HeadStart: 500 * time.Millisecond,
	Header:    "X-Tenant",
	Seed:      7,
	Timeout:   2 * time.Minute,
}

// runFairDemo runs load twice on fresh clusters, without a fair queue and
// then with one admitting inFlight requests at once (0: the cluster's
// slots), and prints what each tenant saw in each run to w.
func runFairDemo(w io.Writer, o options, load fairLoad, inFlight int) error {
	slots := fairDemoEngines * fairDemoEngine.MaxRunning
	if inFlight == 0 {
		inFlight = slots
	}
	o.scrape = 100 * time.Millisecond
	o.slots = fairDemoEngine.MaxRunning
	fmt.Fprintf(w, "demo-fair: %d emulated engines of %d slots; tenant %q keeps %d requests outstanding, tenant %q sends %d one at a time\n\n",
		fairDemoEngines, o.slots, heavyTenant, load.Heavy, lightTenant, load.Light)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "queue\ttenant\tcomplete\tTTFT p50\tp99\ttoken share\trun\t")
	for _, fair := range []int{0, inFlight} {
		o.fairInFlight = fair
		res, err := fairRun(o, load)
		if err != nil {
			return err
		}
		queue := "none"
		if fair > 0 {
			queue = fmt.Sprintf("-fair %d", fair)
		}
		share := res.lightShare()
		for _, t := range []struct {
			name  string
			r     *e2e.Result
			share float64
		}{{heavyTenant, &res.Heavy, 1 - share}, {lightTenant, &res.Light, share}} {
			ms := func(q float64) string { return t.r.TTFT(q).Round(time.Millisecond).String() }
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%.1f%%\t%s\t\n", queue, t.name,
				t.r.Count((*e2e.Outcome).Complete), ms(0.5), ms(0.99), 100*t.share, res.Elapsed.Round(100*time.Millisecond))
		}
	}
	return tw.Flush()
}
