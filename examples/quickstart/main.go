// Command quickstart sends three streamed completions that share a long
// system prompt through llmlb's recommended policy. Pass your replicas'
// OpenAI-compatible base URLs as arguments, and the model they serve in
// $MODEL, or no arguments to start two emulated engines on loopback.
package main

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/engine"
	"github.com/llmlb/llmlb/prefix"
)

type replica string // an endpoint; its Key is its stable identity

func (r replica) Key() string { return string(r) }

// model is the model the replicas serve: $MODEL, or the emulated engines'.
var model = cmp.Or(os.Getenv("MODEL"), engine.DefaultModel)

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var eps []llmlb.Endpoint
	for _, u := range os.Args[1:] {
		eps = append(eps, replica(u))
	}
	for i := 0; i < 2 && len(os.Args) == 1; i++ { // no replicas given: emulate two
		e, err := engine.New(engine.Config{})
		if err != nil {
			log.Fatal(err)
		}
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			log.Fatal(err)
		}
		go e.Serve(ctx, l)
		eps = append(eps, replica("http://"+l.Addr().String()))
	}

	policy, err := llmlb.Default(llmlb.DefaultConfig{}) // the recommended policy
	if err != nil {
		log.Fatal(err)
	}
	b, err := llmlb.New(policy)
	if err != nil {
		log.Fatal(err)
	}
	if err := b.Update(eps); err != nil {
		log.Fatal(err)
	}
	hasher, err := prefix.NewHasher(prefix.HasherConfig{}) // 64-byte blocks of prompt text
	if err != nil {
		log.Fatal(err)
	}

	system := strings.Repeat("You are a careful assistant who answers in one line. ", 300)
	for _, question := range []string{"What is a KV cache?", "What is prefill?", "Why route by prefix?"} {
		prompt := system + question
		p, err := b.Pick(ctx, &llmlb.Request{
			PromptTokens: len(prompt) / 4, // or your tokenizer's count
			MaxTokens:    32,
			Prefix:       hasher.HashString(prefix.Salt{Model: model}, prompt),
		})
		if err != nil {
			log.Fatal(err) // llmlb.ErrNoEndpoints, llmlb.ErrNoCandidates, ...
		}
		start := time.Now()
		err = stream(ctx, p, prompt, func() {
			fmt.Printf("%s: first token after %v\n", p.Endpoint().Key(), time.Since(start).Round(time.Millisecond))
			p.FirstToken() // the commitment point: prefill is done, no retry after this
		})
		p.Done(err) // always, exactly once, successfully or not
		if err != nil {
			log.Fatal(err)
		}
	}
}

// stream sends prompt to the picked replica, calls first on the first event
// and reads the stream to its end.
func stream(ctx context.Context, p llmlb.Pick, prompt string, first func()) error {
	body, _ := json.Marshal(map[string]any{"model": model, "prompt": prompt, "max_tokens": 32, "stream": true})
	req, err := http.NewRequestWithContext(ctx, "POST", p.Endpoint().Key()+"/v1/completions", bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK { // a 404 names a model the replica does not serve
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("%s: %s: %s", p.Endpoint().Key(), resp.Status, bytes.TrimSpace(msg))
	}
	sc := bufio.NewScanner(resp.Body)
	for n := 0; sc.Scan(); {
		if strings.HasPrefix(sc.Text(), "data: ") && n == 0 {
			n++
			first()
		}
	}
	return sc.Err()
}
