//go:build tools

// This file pins the module's dependencies while the packages that use them
// are written; it is not part of any build.
package llmlb

import (
	_ "github.com/cespare/xxhash/v2"
	_ "github.com/hashicorp/golang-lru/v2"
	_ "github.com/prometheus/common/expfmt"
	_ "github.com/stretchr/testify/require"
	_ "go.uber.org/goleak"
	_ "golang.org/x/sync/errgroup"
	_ "gonum.org/v1/plot"
	_ "google.golang.org/grpc"
)
