package main

import (
	"context"

	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// drainingHealth is the health service of the ext_proc listener: the
// picker's health.Server, whose Watch streams end when stop is closed. A
// Watch stream lasts as long as its client keeps it, and the graceful stop
// of the listener waits for every stream: one watcher would hold the drain
// until -drain-timeout and then have the streams in flight cancelled.
type drainingHealth struct {
	*health.Server
	stop <-chan struct{}
}

func (h drainingHealth) Watch(in *healthpb.HealthCheckRequest, stream healthpb.Health_WatchServer) error {
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	go func() {
		select {
		case <-h.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	return h.Server.Watch(in, &watchStream{Health_WatchServer: stream, ctx: ctx})
}

// watchStream is a Watch stream whose context ends when the drain stops
// the listener.
type watchStream struct {
	healthpb.Health_WatchServer
	ctx context.Context
}

func (w *watchStream) Context() context.Context { return w.ctx }
