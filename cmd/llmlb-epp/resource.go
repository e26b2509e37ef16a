package main

import (
	"context"
	"errors"
	"log/slog"

	"go.opentelemetry.io/otel/sdk/resource"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
)

// serviceName is the service.name of the picker's telemetry, unless
// OTEL_SERVICE_NAME or OTEL_RESOURCE_ATTRIBUTES names another.
const serviceName = "llmlb-epp"

// telemetryResource returns the OpenTelemetry resource of the picker's
// metrics, which /metrics writes as target_info: the SDK's default resource
// with serviceName in place of its "unknown_service:" and the executable's
// name. As in the default (resource.Default, go.opentelemetry.io/otel/sdk
// v1.47.0 resource/resource.go), the attributes of OTEL_RESOURCE_ATTRIBUTES
// and then OTEL_SERVICE_NAME override the service name, and the SDK's own
// (telemetry.sdk.*) are added; resource.New merges its detectors in order,
// each over the ones before (resource/auto.go detect). Invalid pairs in
// OTEL_RESOURCE_ATTRIBUTES are left out and logged, as the default resource
// leaves them out, rather than stop the picker.
func telemetryResource(ctx context.Context, log *slog.Logger) (*resource.Resource, error) {
	res, err := resource.New(ctx,
		resource.WithAttributes(semconv.ServiceName(serviceName)),
		resource.WithFromEnv(),
		resource.WithTelemetrySDK())
	if errors.Is(err, resource.ErrPartialResource) {
		log.Warn("llmlb-epp: OpenTelemetry resource attributes left out", "error", err)
		err = nil
	}
	return res, err
}
