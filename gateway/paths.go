package gateway

import (
	"encoding/json"
	"fmt"
	"net/http"
	"path"
	"strings"
)

// defaultPaths are the paths a Gateway forwards without Config.AllowPaths:
// the inference APIs of vLLM, SGLang, TensorRT-LLM and llama.cpp, which
// clients call, and none of their administration endpoints, which a client
// must not reach through the gateway (vLLM's /sleep, /wake_up,
// /collective_rpc, /reset_prefix_cache and /v1/load_lora_adapter, SGLang's
// /update_weights_from_disk, /flush_cache and /get_server_info, llama.cpp's
// /slots and /props). A path ending in "/" stands for every path under it.
var defaultPaths = []string{
	// OpenAI-compatible (vLLM's api_server, SGLang's, trtllm-serve,
	// llama.cpp's server).
	"/v1/completions", "/v1/chat/completions", "/v1/embeddings", "/v1/models", "/v1/models/",
	"/v1/responses", "/v1/responses/", // retrieve, cancel, delete, input items
	"/v1/audio/transcriptions", "/v1/audio/translations",
	"/v1/messages", "/v1/messages/count_tokens", // Anthropic's Messages API, as vLLM serves it
	"/v1/score", "/v1/rerank", "/v2/rerank", "/v1/classify",
	// vLLM's and SGLang's own inference routes.
	"/score", "/rerank", "/pooling", "/classify", "/tokenize", "/detokenize", "/generate",
	// TGI's and llama.cpp's native routes, and llama.cpp's OpenAI routes
	// without /v1.
	"/generate_stream", "/completion", "/completions", "/chat/completions", "/embedding",
	"/embeddings", "/infill",
	// Probes.
	"/health", "/ping", "/version",
}

// pathSet is the set of paths a Gateway forwards (see Config.AllowPaths).
type pathSet struct {
	all      bool                // "/" was allowed: every path
	exact    map[string]struct{} // paths allowed as they are
	prefixes []string            // paths ending in "/": every path under them
}

// newPathSet returns the set of defaultPaths and extra.
func newPathSet(extra []string) (pathSet, error) {
	s := pathSet{exact: make(map[string]struct{})}
	for i, p := range append(append([]string(nil), defaultPaths...), extra...) {
		if !strings.HasPrefix(p, "/") || path.Clean(p) != strings.TrimSuffix(p, "/") && p != "/" {
			return pathSet{}, fmt.Errorf("%w: AllowPaths[%d] %q is not a clean absolute path", ErrInvalidConfig, i-len(defaultPaths), p)
		}
		switch {
		case p == "/":
			s.all = true
		case strings.HasSuffix(p, "/"):
			s.prefixes = append(s.prefixes, p)
		default:
			s.exact[p] = struct{}{}
		}
	}
	return s, nil
}

// allows reports whether the set holds the request path p, once its dot
// segments are resolved (as the gateway's transport resolves them before
// forwarding), so that "/v1/../sleep" is "/sleep". A trailing slash is
// ignored: servers route "/v1/completions/" as "/v1/completions".
func (s pathSet) allows(p string) bool {
	if s.all {
		return true
	}
	if !strings.HasPrefix(p, "/") {
		p = "/" + p
	}
	p = path.Clean(p) // a clean path, as clients send, is not copied
	if _, ok := s.exact[p]; ok {
		return true
	}
	for _, pre := range s.prefixes {
		if strings.HasPrefix(p, pre) || p+"/" == pre {
			return true
		}
	}
	return false
}

// notFound answers a request for a path the gateway does not forward, in
// the OpenAI error format, as the engines answer a path they do not serve.
func notFound(w http.ResponseWriter) {
	var body struct {
		Error struct {
			Message string `json:"message"`
			Type    string `json:"type"`
			Code    int    `json:"code"`
		} `json:"error"`
	}
	body.Error.Message = "The gateway does not serve this path."
	body.Error.Type = "not_found_error"
	body.Error.Code = http.StatusNotFound
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusNotFound)
	_ = json.NewEncoder(w).Encode(&body)
}
