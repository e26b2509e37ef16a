package apierror

import (
	"net/http"
	"strings"
)

// accountHeaderPrefixes are the lower-cased prefixes of the response
// headers that name the account an upstream answered for, its organisation,
// project, deployment or region, or its quota:
//
//   - OpenAI's openai-organization, openai-project, openai-processing-ms
//     and openai-version, and the x-ratelimit-limit-, -remaining- and
//     -reset-requests and -tokens that it, Azure OpenAI and others send
//     (developers.openai.com/api/reference/overview, "Debugging requests");
//   - Anthropic's anthropic-organization-id, sent with every answer, and
//     anthropic-ratelimit-* (docs.anthropic.com/en/api/overview, "Response
//     headers");
//   - Azure's x-ms-region and x-ms-deployment-name (Azure OpenAI; as seen in
//     BerriAI/litellm#15232 and openai/openai-python#3271), and the
//     azureml-model-deployment that names the deployment of an Azure
//     Machine Learning online endpoint that answered;
//   - the IETF draft's RateLimit and RateLimit-Policy.
var accountHeaderPrefixes = []string{
	"openai-",
	"anthropic-",
	"x-ratelimit-",
	"ratelimit",
	"x-ms-",
	"azureml-",
}

// accountHeaders are the other headers, lower-cased, that StripAccount
// deletes: the cookies an upstream sets (Cloudflare's __cf_bm in front of
// OpenAI's and Anthropic's APIs, a replica's session), which are the
// upstream's and not the gateway's, and Azure API Management's request id.
var accountHeaders = []string{"set-cookie", "set-cookie2", "apim-request-id"}

// StripAccount deletes from h, the header of an upstream's answer, the
// fields that name or describe the operator's account with the upstream
// rather than the answer (see accountHeaderPrefixes and accountHeaders).
// Retry-After and Retry-After-Ms, the wait an answer asks of its client,
// stay. It deletes the rate-limit headers, so whatever reads them (a
// retry.QuotaReporter, a tier's cooldown) must do so before.
func StripAccount(h http.Header) {
	for k := range h {
		if AccountHeader(k) {
			delete(h, k)
		}
	}
}

// AccountHeader reports whether name, a response header's name, is one
// StripAccount deletes.
func AccountHeader(name string) bool {
	for _, p := range accountHeaderPrefixes {
		if len(name) >= len(p) && strings.EqualFold(name[:len(p)], p) {
			return true
		}
	}
	for _, n := range accountHeaders {
		if strings.EqualFold(name, n) {
			return true
		}
	}
	return false
}
