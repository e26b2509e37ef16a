// Package respid reads the id of a stored OpenAI Responses API response
// from a request's method and path, as package httplb and package extproc
// route them: one set of rules for both.
package respid

import (
	"net/http"
	"strings"
)

// MaxLen bounds the response ids remembered and looked up: a longer id is
// ignored. OpenAI's, vLLM's and SGLang's ids ("resp_" and 32 to 48
// characters) are far shorter.
const MaxLen = 256

// Stored returns the id of the stored response that a request with the
// given method and decoded path (url.URL.Path, without the query)
// addresses, and reports whether it addresses one: a GET of
// .../responses/{id} (retrieve, with or without ?stream=true), a POST to
// .../responses/{id}/cancel, as vLLM and SGLang route them
// (retrieve_responses and cancel_responses in vLLM's
// vllm/entrypoints/openai/responses/api_router.py, commit f6e93254b870;
// v1_retrieve_responses and v1_cancel_responses in SGLang's
// python/sglang/srt/entrypoints/http_server.py, main as of 2026), and the
// OpenAI API's DELETE of .../responses/{id} and GET of
// .../responses/{id}/input_items, which an engine storing responses would
// serve on the same replica. The id is one path segment of 1 to MaxLen
// bytes, none of them a control character, a space or '/', and neither "."
// nor "..".
//
// The path is decoded, as the engines' routers (Starlette's) match it: an
// escaped slash ("%2F") is a slash there, so that "/v1/responses/a%2Fb"
// addresses no stored response, and any other escape stands for the byte it
// encodes. Stored does not allocate, and takes time linear in the length of
// path.
func Stored(method, path string) (string, bool) {
	switch method {
	case http.MethodGet:
		if id, ok := segment(strings.CutSuffix(path, "/input_items")); ok {
			return id, true
		}
		return segment(path, true)
	case http.MethodDelete:
		return segment(path, true)
	case http.MethodPost:
		return segment(strings.CutSuffix(path, "/cancel"))
	}
	return "", false
}

// segment returns the last segment of path if ok is set and path is
// .../responses/{id} with a valid id (see Stored).
func segment(path string, ok bool) (string, bool) {
	if !ok {
		return "", false
	}
	i := strings.LastIndexByte(path, '/')
	if i < 0 || !strings.HasSuffix(path[:i], "/responses") {
		return "", false
	}
	id := path[i+1:]
	if id == "" || len(id) > MaxLen || id == "." || id == ".." {
		return "", false
	}
	for j := 0; j < len(id); j++ {
		if c := id[j]; c <= ' ' || c == 0x7f {
			return "", false
		}
	}
	return id, true
}
