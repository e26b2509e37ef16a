package sim

import (
	"time"

	"github.com/llmlb/llmlb/fair"
)

// Figures of the classes scenario.
const (
	// ClassesInteractive, ClassesStandard and ClassesBatch are the demands
	// of the classes scenario's interactive, standard and batch traffic, as
	// shares of [TenantsCapacity]: the batch traffic alone overloads the
	// cluster, and the other two together nearly fill it.
	ClassesInteractive = 0.2
	ClassesStandard    = 0.8
	ClassesBatch       = 1.5
	// ClassesDuration is the classes scenario's arrival window.
	ClassesDuration = 60 * time.Second
)

// ClassesScenario returns the classes scenario: the default scenario's
// cluster and workload lengths, the traffic of one customer in three
// priority classes, each reported as a tenant of its own ([Result].Tenants)
// named after its class: "interactive" (steps a user waits on), ClassesInteractive
// times [TenantsCapacity]; "standard", ClassesStandard times it; and
// "batch" (background jobs), ClassesBatch times it. It compares, under the
// default policy, a [fair.Queue] whose one principal is the customer,
// capping the requests in flight at 64 per replica and those waiting at
// 256, the excess refused:
//
//   - none: no admission control, for reference.
//   - fifo: the queue ignoring the classes; with one principal it admits
//     in arrival order.
//   - priority: the queue ordering by class, with the default aging.
//   - priority-no-aging: the same without aging, so that batch requests
//     wait as long as more urgent ones do.
func ClassesScenario() Scenario {
	w := DefaultSynthetic(0, 0)
	demand := TenantsCapacity * (ClassesInteractive + ClassesStandard + ClassesBatch)
	w.Rate = demand * tenantsRamp
	w.Requests = int(demand * ClassesDuration.Seconds())
	w.Tenants = []TenantShare{
		{Name: "interactive", Share: ClassesInteractive, Class: fair.Interactive},
		{Name: "standard", Share: ClassesStandard, Class: fair.Standard},
		{Name: "batch", Share: ClassesBatch, Class: fair.Batch},
	}
	const replicas = 8
	queue := fair.Config{MaxInFlight: 64 * replicas, MaxWaiting: 256}
	noAging := queue
	noAging.AgingInterval = -1
	const customer = "customer"
	return Scenario{
		Name:     "classes",
		Doc:      "default, one customer's interactive, standard and batch traffic at 2.5x the capacity: priority classes compared",
		Config:   Config{Replicas: replicas, Routers: 1, Scrape: time.Second, Engine: Engine{KVBlocks: DefaultScenarioKVBlocks}},
		Workload: w,
		Policies: []string{"default"},
		Admissions: []Admission{
			{Name: "none"},
			{Name: "fifo", Kind: FairQueue, Queue: queue, Principal: customer, IgnoreClass: true},
			{Name: "priority", Kind: FairQueue, Queue: queue, Principal: customer},
			{Name: "priority-no-aging", Kind: FairQueue, Queue: noAging, Principal: customer},
		},
	}
}
