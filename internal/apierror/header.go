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

// upstreamHeaders are the headers, lower-cased, of an upstream's answer
// that StripUpstream deletes besides StripAccount's, each for one of three
// reasons:
//
//   - Server, X-Powered-By and Via name the software that answered and its
//     version (uvicorn's "server: uvicorn", which vLLM and SGLang run on;
//     an nginx or squid in between) and the proxies and hosts behind the
//     gateway: RFC 9110, section 7.6.3, has an intermediary at a network's
//     edge not forward the names of hosts within it;
//   - endpoint-load-metrics is the ORCA load report a replica sends to
//     its balancer (its KV cache use, its queue), which the Transport
//     records before its answer gets here: the fleet's load is not the
//     client's to read;
//   - Strict-Transport-Security, Alt-Svc, NEL, Report-To and
//     Reporting-Endpoints are policies of the upstream's origin, which a
//     browser would apply to the gateway's: a managed provider's HSTS
//     with includeSubDomains would pin every subdomain of the gateway's
//     domain to HTTPS for a year, its Alt-Svc announce an HTTP/3 port
//     the gateway may not have, and its NEL send the network errors of
//     the gateway's clients to the provider's CDN.
//
// The other headers describe the answer and stay: its content, caching
// and date; the ids and timings a provider or its CDN gives a request
// (X-Request-Id, cf-ray, x-envoy-upstream-service-time), which name
// nothing of the operator's and which its support asks for; and the CORS
// headers, which may be the operator's own choice of origins, set on the
// engine (vLLM's --allowed-origins).
var upstreamHeaders = []string{
	"server", "x-powered-by", "via",
	"endpoint-load-metrics",
	"strict-transport-security", "alt-svc", "nel", "report-to", "reporting-endpoints",
}

// StripUpstream deletes from h, the header of an upstream's answer, what
// StripAccount deletes and the fields that are the upstream's own rather
// than the answer's (see upstreamHeaders). Whatever reads them (the
// Transport's ORCA store) must do so before.
func StripUpstream(h http.Header) {
	for k := range h {
		if AccountHeader(k) || upstreamHeader(k) {
			delete(h, k)
		}
	}
}

// upstreamHeader reports whether name, a response header's name, is one
// StripUpstream deletes besides StripAccount's.
func upstreamHeader(name string) bool {
	for _, n := range upstreamHeaders {
		if strings.EqualFold(name, n) {
			return true
		}
	}
	return false
}
