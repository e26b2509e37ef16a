package extproc

import (
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/types/known/structpb"
)

// TestSubsetHintDroppedOnceRouted: a stream lets the data plane's subset
// hint go with the request's headers once it is routed, and takes no hint
// after that: a long stream keeps none of what the picker no longer reads
// (a hint may be megabytes, outside the Server's buffer budget).
func TestSubsetHintDroppedOnceRouted(t *testing.T) {
	hint, err := structpb.NewStruct(map[string]any{SubsetKey: []any{"10.0.0.1:8000"}})
	if err != nil {
		t.Fatal(err)
	}
	m := &extprocv3.ProcessingRequest{MetadataContext: &corev3.Metadata{
		FilterMetadata: map[string]*structpb.Struct{SubsetNamespace: hint},
	}}
	st := headersOnly("POST", "/v1/chat/completions")
	st.noteSubset(m)
	if st.subset == nil {
		t.Fatal("the hint before routing was not kept")
	}
	st.routed = true
	st.dropHeaders()
	if st.subset != nil {
		t.Fatal("the hint is kept after routing")
	}
	st.noteSubset(m)
	if st.subset != nil {
		t.Fatal("a hint after routing was kept")
	}
}
