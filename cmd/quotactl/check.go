package main

import (
	"context"

	"github.com/quotaplane/quotaplane/pkg/policy"
)

func runCheck(_ context.Context, e *env, args []string) error {
	fs := e.flags()
	dirs, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(dirs) == 0 {
		return usageError("name at least one directory of quota objects, such as config/samples")
	}
	if !policy.Check(e.stdout, dirs...) {
		return errFound
	}
	return nil
}
