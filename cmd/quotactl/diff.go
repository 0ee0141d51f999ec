package main

import (
	"context"
	"fmt"

	"github.com/quotaplane/quotaplane/pkg/policy"
	"github.com/quotaplane/quotaplane/pkg/report"
	"github.com/quotaplane/quotaplane/pkg/whatif"
)

func runDiff(_ context.Context, e *env, args []string) error {
	fs := e.flags()
	format := fs.String("o", "table", "output format: table, json or markdown")
	exitCode := fs.Bool("exit-code", false, "exit 1 when the policies differ, as git diff --exit-code")
	paths, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(paths) != 2 {
		return usageError("want OLD and NEW, two directories (or files) of quota objects; got %d operand(s)", len(paths))
	}
	if err := report.CheckFormat(*format); err != nil {
		return usageError("%v", err)
	}
	old, err := policy.LoadPath(paths[0])
	if err != nil {
		return fmt.Errorf("OLD: %w", err)
	}
	new, err := policy.LoadPath(paths[1])
	if err != nil {
		return fmt.Errorf("NEW: %w", err)
	}
	d := whatif.Compare(paths[0], old, paths[1], new)
	if err := report.Write(e.stdout, *format, d); err != nil {
		return err
	}
	if *exitCode && !d.Empty() {
		return errFound
	}
	return nil
}
