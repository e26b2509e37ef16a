package spill_test

import (
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"

	"github.com/llmlb/llmlb/spill"
)

// toServer sends every request to one server, as a tier's httplb.Transport
// would send it to one of the tier's endpoints.
type toServer struct{ base *url.URL }

func (s toServer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.URL.Scheme, r.URL.Host = s.base.Scheme, s.base.Host
	return http.DefaultTransport.RoundTrip(r)
}

// A provisioned deployment that is out of capacity spills its requests to a
// pay-as-you-go one, marked, until the wait it asked for has passed.
func Example() {
	ptu := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Retry-After", "30")
		http.Error(w, `{"error":{"message":"capacity exceeded"}}`, http.StatusTooManyRequests)
	}))
	defer ptu.Close()
	paygo := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, `{"choices":[{"text":"hi"}]}`)
	}))
	defer paygo.Close()
	at := func(s *httptest.Server) toServer { u, _ := url.Parse(s.URL); return toServer{u} }

	tr, err := spill.New(spill.Config{
		Tiers: []spill.Tier{{Name: "ptu", Transport: at(ptu)}, {Name: "paygo", Transport: at(paygo)}},
		Observer: func(e spill.Event) {
			fmt.Printf("spilled from %s to %s: %s\n", e.From, e.To, e.Reason)
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	client := &http.Client{Transport: tr}
	for range 2 {
		resp, err := client.Post("http://gateway.invalid/v1/completions", "application/json", strings.NewReader(`{"prompt":"Say hi"}`))
		if err != nil {
			log.Fatal(err)
		}
		resp.Body.Close()
		fmt.Println(resp.StatusCode, resp.Header.Get(spill.DefaultHeader))
	}
	fmt.Println("cooling:", tr.Cooling())
	// Output:
	// spilled from ptu to paygo: throttled
	// 200 ptu
	// spilled from ptu to paygo: cooling
	// 200 ptu
	// cooling: [ptu]
}
