package httplb_test

import (
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"

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

// An agent's own client, with no gateway: an httplb.Transport as the
// http.Client's transport routes each call, and the turns of a conversation,
// whose prompts share their history, stay on the replica that caches it.
func ExampleNewTransport() {
	var (
		mu       sync.Mutex
		answered []string
	)
	replica := func(name string) *httptest.Server {
		return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			answered = append(answered, name)
			mu.Unlock()
			fmt.Fprint(w, `{"choices":[{"message":{"role":"assistant","content":"ok"}}]}`)
		}))
	}
	a, b := replica("a"), replica("b")
	defer a.Close()
	defer b.Close()

	policy, _ := llmlb.Default(llmlb.DefaultConfig{})
	bal, _ := llmlb.New(policy)
	eps, _ := httplb.NewEndpoints(a.URL, b.URL)
	_ = bal.Update(eps)
	tr, err := httplb.NewTransport(httplb.Config{Balancer: bal})
	if err != nil {
		log.Fatal(err)
	}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}

	history := `{"role":"system","content":"` + strings.Repeat("You plan trips for a travel agency. ", 60) + `"}`
	for turn := 1; turn <= 3; turn++ {
		history += fmt.Sprintf(`,{"role":"user","content":"step %d: find a train to Lyon"}`, turn)
		// The URL's host is ignored: the Transport picks the replica.
		resp, err := client.Post("http://llm/v1/chat/completions", "application/json",
			strings.NewReader(`{"model":"m","messages":[`+history+`]}`))
		if err != nil {
			log.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	mu.Lock()
	defer mu.Unlock()
	fmt.Println("calls:", len(answered), "all on one replica:", answered[0] == answered[1] && answered[1] == answered[2])
	// Output: calls: 3 all on one replica: true
}
