package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/llmlb/llmlb/internal/sim"
)

// poolScenarioNames lists the scenarios of sim.PoolScenarios, for the
// -scenario help.
func poolScenarioNames() []string {
	var names []string
	for _, s := range sim.PoolScenarios() {
		names = append(names, s.Name)
	}
	return names
}

// runPool runs a scenario of deployments behind APIs (sim.PoolScenarios)
// under seeds seeds from seed, pools them and prints its table. These
// scenarios take no flag but -scenario, -seed and -seeds.
func runPool(ctx context.Context, fs *flag.FlagSet, sc sim.PoolScenario, seed uint64, seeds int, stdout io.Writer) error {
	var other []string
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "scenario", "seed", "seeds":
		default:
			other = append(other, "-"+f.Name)
		}
	})
	if len(other) > 0 {
		return usageError{fmt.Errorf("the %s scenario takes only -seed and -seeds, not %s", sc.Name, strings.Join(other, ", "))}
	}
	runs := make([][]*sim.PoolResult, len(sc.Routings))
	for k := range seeds {
		rs, err := sim.RunPool(ctx, &sc, seed+uint64(k))
		if err != nil {
			return err
		}
		for i, r := range rs {
			runs[i] = append(runs[i], r)
		}
	}
	results := make([]*sim.PoolResult, len(runs))
	for i := range runs {
		var err error
		if results[i], err = sim.MergePoolResults(runs[i]...); err != nil {
			return err
		}
	}
	return sim.WritePoolTable(stdout, &sc, seed, seeds, results)
}
