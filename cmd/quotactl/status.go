package main

import "context"

func runStatus(ctx context.Context, e *env, args []string) error { return usageError("not yet") }
