package main

import (
	"context"
	"fmt"
	"time"

	"github.com/quotaplane/quotaplane/pkg/policy"
	"github.com/quotaplane/quotaplane/pkg/report"
	"github.com/quotaplane/quotaplane/pkg/whatif"
)

func runSimulate(ctx context.Context, e *env, args []string) error {
	fs := e.flags()
	newPath := fs.String("policy", "", "the new policy: a directory (or file) of quota objects (required)")
	basePath := fs.String("baseline", "", "the policy to compare with, such as the main branch's copy (optional)")
	profile := fs.String("profile", whatif.ProfileSeed002, "the load: seed002 (seed 002's 5,000 tenants at 100,000 req/s) or a CSV file with the columns tenant,tier,rate (docs/quotactl.md)")
	duration := fs.Duration("duration", 10*time.Second, "virtual time to replay")
	seed := fs.Uint64("seed", 1, "the profile's seed: one seed, one sequence of requests")
	top := fs.Int("top", 10, "heaviest tenants to list")
	format := fs.String("o", "table", "output format: table, json or markdown")
	operands, err := parse(fs, args)
	if err != nil {
		return err
	}
	switch {
	case len(operands) > 0:
		return usageError("unexpected operand %q: name the policies with --policy and --baseline", operands[0])
	case *newPath == "":
		return usageError("--policy is required: the directory (or file) of the new quota objects")
	case *duration <= 0 || *duration > 24*time.Hour:
		return usageError("--duration %s: want more than 0 and at most 24h", *duration)
	case *seed == 0:
		return usageError("--seed 0: want a seed of at least 1")
	case *top < 0:
		return usageError("--top %d: want 0 or more", *top)
	}
	if err := report.CheckFormat(*format); err != nil {
		return usageError("%v", err)
	}
	b, summary, err := whatif.LoadProfile(*profile, *duration, *seed)
	if err != nil {
		return err
	}
	sim := &whatif.Simulation{Profile: summary, Seed: *seed, MeasuredSeconds: duration.Seconds()}
	if *basePath != "" {
		base, err := policy.LoadPath(*basePath)
		if err != nil {
			return fmt.Errorf("--baseline: %w", err)
		}
		if sim.Baseline, err = whatif.Simulate(ctx, *basePath, base, b, *top); err != nil {
			return err
		}
	}
	p, err := policy.LoadPath(*newPath)
	if err != nil {
		return fmt.Errorf("--policy: %w", err)
	}
	if sim.New, err = whatif.Simulate(ctx, *newPath, p, b, *top); err != nil {
		return err
	}
	return report.Write(e.stdout, *format, sim)
}
