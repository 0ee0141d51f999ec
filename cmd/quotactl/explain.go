package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/quotaplane/quotaplane/pkg/explain"
	"github.com/quotaplane/quotaplane/pkg/policy"
	"github.com/quotaplane/quotaplane/pkg/report"
)

func runExplain(ctx context.Context, e *env, args []string) error {
	fs := e.flags()
	enforcer := fs.String("enforcer", "http://127.0.0.1:9090", "the enforcer's admin listener (its -admin-listen; from outside the pod, kubectl port-forward POD 9090)")
	tokenFile := fs.String("token-file", "", "a file whose first line is a bearer token of the enforcer's -admin-token-file")
	timeout := fs.Duration("timeout", 5*time.Second, "how long to wait for the answer")
	format := fs.String("o", "table", "output format: table, json or markdown")
	operands, err := parse(fs, args)
	if err != nil {
		return err
	}
	switch {
	case len(operands) != 1:
		return usageError("want one TENANT; got %d operand(s)", len(operands))
	case !policy.ValidName(operands[0]):
		return usageError("tenant %q: a tenant name is 1 to %d printable ASCII characters without spaces", operands[0], policy.MaxNameBytes)
	case *timeout <= 0:
		return usageError("--timeout %s: want more than 0", *timeout)
	}
	if err := report.CheckFormat(*format); err != nil {
		return usageError("%v", err)
	}
	var token string
	if *tokenFile != "" {
		data, err := os.ReadFile(*tokenFile)
		if err != nil {
			return fmt.Errorf("--token-file: %w", err)
		}
		token, _, _ = strings.Cut(strings.TrimSpace(string(data)), "\n")
		if token = strings.TrimSpace(token); token == "" {
			return fmt.Errorf("--token-file %s: no token on its first line", *tokenFile)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	x, err := explain.Fetch(ctx, http.DefaultClient, *enforcer, token, operands[0])
	if err != nil {
		return err
	}
	return report.Write(e.stdout, *format, x)
}
