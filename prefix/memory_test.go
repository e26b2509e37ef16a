package prefix

import (
	"runtime"
	"testing"
)

// TestBytesPerBlock measures the heap used per indexed block and checks it
// against the documented BytesPerBlock, for blocks held by one endpoint
// each (the worst case: nothing is shared) and for blocks held by several.
func TestBytesPerBlock(t *testing.T) {
	if testing.Short() || raceEnabled {
		t.Skip("allocates about 200 MB and takes seconds; skipped with -short and under the race detector")
	}
	const total = 1 << 20
	cases := []struct {
		name      string
		endpoints int
		shared    bool
		growing   bool // a capacity 8 times the blocks, stored just past a power of two
	}{
		{"distinct/endpoints=1", 1, false, false},
		{"distinct/endpoints=8", 8, false, false},
		{"shared/endpoints=8", 8, true, false},
		// Below its capacity, just past a power of two: the endpoint's
		// nodes and table have just doubled.
		{"growing/endpoints=1", 1, false, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			per, capacity := total/tc.endpoints, total/tc.endpoints
			if tc.growing {
				per, capacity = total/2+1, 4*total
			}
			blocks := make([]uint64, per)
			before := heapInUse()
			x := mustIndex(t, IndexConfig{Capacity: capacity})
			for e := 0; e < tc.endpoints; e++ {
				for i := range blocks {
					base := uint64(e)
					if tc.shared {
						base = 0
					}
					blocks[i] = (base<<32 | uint64(i) + 1) * 0x9e3779b97f4a7c15
				}
				must(t, x.Stored(epName(e), 16, blocks...))
			}
			after := heapInUse()
			runtime.KeepAlive(x)
			perBlock := float64(after-before) / float64(per*tc.endpoints)
			t.Logf("%d blocks over %d endpoints: %.1f bytes per block per endpoint", per*tc.endpoints, tc.endpoints, perBlock)
			if perBlock > BytesPerBlock {
				t.Fatalf("%.1f bytes per block > documented %d", perBlock, BytesPerBlock)
			}
		})
	}
}

// TestBytesPerBlockLowered checks the documented bound on the heap of an
// index whose capacities were lowered after it filled: about 1.6 times
// BytesPerBlock per block of the new capacities, at the factor that
// measured worst (the holder table just above 1/8 full, the endpoints'
// storage not yet compacted).
func TestBytesPerBlockLowered(t *testing.T) {
	if testing.Short() || raceEnabled {
		t.Skip("allocates about 200 MB and takes seconds; skipped with -short and under the race detector")
	}
	const endpoints, per = 8, 1 << 17
	before := heapInUse()
	x := mustIndex(t, IndexConfig{Capacity: per})
	blocks := make([]uint64, per)
	for e := 0; e < endpoints; e++ {
		for i := range blocks {
			blocks[i] = (uint64(e)<<32 | uint64(i) + 1) * 0x9e3779b97f4a7c15
		}
		must(t, x.Stored(epName(e), 16, blocks...))
	}
	lowered := per * 2 / 15
	for e := 0; e < endpoints; e++ {
		must(t, x.SetCapacity(epName(e), lowered))
	}
	after := heapInUse()
	runtime.KeepAlive(x)
	perBlock := float64(after-before) / float64(endpoints*lowered)
	t.Logf("capacities lowered from %d to %d: %.1f bytes per block of capacity", per, lowered, perBlock)
	if limit := 1.6 * BytesPerBlock; perBlock > limit {
		t.Fatalf("%.1f bytes per block of capacity > documented %.0f", perBlock, limit)
	}
}

func heapInUse() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}
