// Package e2e is the end-to-end harness of llmlb's net/http integration:
// a [Cluster] of emulated inference engines (package engine) on loopback and
// an open-loop load generator ([Generate]) that measures what clients see.
//
// The package's tests put a gateway (package httplb over an llmlb.Balancer,
// with a signals.Scraper reading the engines' /metrics, or package gateway,
// which assembles the same) in front of a Cluster and compare policies on
// the same workload, and follow requests of each API the engines serve
// through retries, hedges and engines stopped mid-request; examples/gateway uses it
// for its -demo mode and examples/agent for its engines. It is internal to
// the module, so its API may change with its tests. Nothing listens beyond
// 127.0.0.1.
package e2e
