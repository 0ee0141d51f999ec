package main

import "context"

func runExplain(ctx context.Context, e *env, args []string) error { return usageError("not yet") }
