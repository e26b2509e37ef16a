package engine_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"strings"

	"github.com/llmlb/llmlb/engine"
)

func Example() {
	e, err := engine.New(engine.Config{Speedup: 100})
	if err != nil {
		log.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Serve(ctx, l) }()

	client := &http.Client{Transport: &http.Transport{}}
	resp, err := client.Post("http://"+l.Addr().String()+"/v1/completions", "application/json",
		strings.NewReader(`{"prompt":"Say hello","max_tokens":3}`))
	if err != nil {
		log.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	client.CloseIdleConnections()
	fmt.Println(resp.StatusCode, strings.Contains(string(body), `"text":" tok tok tok"`))
	fmt.Println(e.Stats().Finished)

	stop()
	fmt.Println(<-done)
	// Output:
	// 200 true
	// 1
	// context canceled
}
