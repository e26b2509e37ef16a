package httplb_test

import (
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/httplb"
)

// A gateway in front of two replicas: the proxy routes each request with the
// default policy, streams the events as they come, and retries a replica's
// failure on the other one before the first event.
func ExampleNewProxy() {
	replica := func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"choices\":[{\"text\":\"hi\"}]}\n\ndata: [DONE]\n\n")
	}
	a := httptest.NewServer(http.HandlerFunc(replica))
	defer a.Close()
	b := httptest.NewServer(http.HandlerFunc(replica))
	defer b.Close()

	policy, err := llmlb.Default(llmlb.DefaultConfig{})
	if err != nil {
		log.Fatal(err)
	}
	bal, err := llmlb.New(policy)
	if err != nil {
		log.Fatal(err)
	}
	eps, err := httplb.NewEndpoints(a.URL, b.URL)
	if err != nil {
		log.Fatal(err)
	}
	if err := bal.Update(eps); err != nil {
		log.Fatal(err)
	}
	tr, err := httplb.NewTransport(httplb.Config{Balancer: bal})
	if err != nil {
		log.Fatal(err)
	}
	gateway := httptest.NewServer(httplb.NewProxy(tr))
	defer gateway.Close()

	resp, err := http.Post(gateway.URL+"/v1/completions", "application/json",
		strings.NewReader(`{"model":"m","prompt":"Say hi","max_tokens":4,"stream":true}`))
	if err != nil {
		log.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	fmt.Println(resp.StatusCode)
	fmt.Print(string(body))
	http.DefaultClient.CloseIdleConnections()
	tr.CloseIdleConnections()
	// Output:
	// 200
	// data: {"choices":[{"text":"hi"}]}
	//
	// data: [DONE]
}
