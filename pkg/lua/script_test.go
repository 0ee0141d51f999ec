package lua

import (
	"context"
	"fmt"
	"io/fs"
	"strings"
	"testing"

	"github.com/quotaplane/quotaplane/pkg/redistest"
)

// TestScriptHeaders: every script states its contract in its header.
func TestScriptHeaders(t *testing.T) {
	names, err := fs.Glob(files, "*.lua")
	if err != nil || len(names) == 0 {
		t.Fatalf("no scripts: %v", err)
	}
	for _, name := range names {
		if name == bucketLua { // not a script: composed into them
			continue
		}
		src, _ := files.ReadFile(name)
		header := strings.SplitN(string(src), "\n\n", 2)[0]
		for _, part := range []string{"-- KEYS", "-- ARGV", "Returns", "Side effects", "Complexity"} {
			if !strings.Contains(header, part) {
				t.Errorf("%s: the header does not state %q", name, part)
			}
		}
	}
}

// TestNoScriptRecovery: after SCRIPT FLUSH (as after a restart or a
// failover) a script runs again by SHA, alone and in a pipeline.
func TestNoScriptRecovery(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	ctx := context.Background()
	for round := range 3 {
		if err := c.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		n, err := Heartbeat.Run(ctx, c, []string{"qp:{t}:nodes"}, "n1", 1000).Int64()
		if err != nil || n != 1 {
			t.Fatalf("round %d: Run after SCRIPT FLUSH: %d, %v", round, n, err)
		}
		if err := c.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		calls := []Call{
			{Keys: []string{"qp:{t}:nodes"}, Args: []any{"n1", 1000}},
			{Keys: []string{"qp:{t}:nodes"}, Args: []any{"n2", 1000}},
		}
		if err := Heartbeat.RunPipelined(ctx, c, calls); err != nil {
			t.Fatalf("round %d: RunPipelined after SCRIPT FLUSH: %v", round, err)
		}
		for i, call := range calls {
			if n, err := call.Cmd.Int64(); err != nil || n != int64(i+1) {
				t.Fatalf("round %d: pipelined call %d: %d, %v", round, i, n, err)
			}
		}
		if err := c.Del(ctx, "qp:{t}:nodes").Err(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestDecideShape: the scripts' headers state the record and reply sizes
// the Go wrappers use, and the scripts read records of that size.
func TestDecideShape(t *testing.T) {
	for _, tc := range []struct {
		script, says string
		code         string
	}{
		{"decide.lua", fmt.Sprintf("records of %d little-endian int64", DecideRequestFields), fmt.Sprintf("#requests, %d do", 8*DecideRequestFields)},
		{"decide.lua", fmt.Sprintf("per request %d integers", DecideReplyFields), fmt.Sprintf("o = o + %d", DecideReplyFields)},
		{"refund.lua", fmt.Sprintf("records of %d little-endian int64", RefundRecordFields), fmt.Sprintf("%d * (i - 1) + 1", 8*RefundRecordFields)},
		{"debit.lua", fmt.Sprintf("records of %d little-endian int64", DebitRecordFields), fmt.Sprintf("%d * (i - 1) + 1", 8*DebitRecordFields)},
		{"reconcile.lua", fmt.Sprintf("records of %d little-endian int64", ReconcileRecordFields), fmt.Sprintf("%d * (i - 5) + 1", 8*ReconcileRecordFields)},
		{"reconcile.lua", fmt.Sprintf("each of %d water levels", ClaimPoints), fmt.Sprintf("local POINTS = %d", ClaimPoints)},
		{"bucket.lua", fmt.Sprintf("each starting with %d\n-- little-endian int64", LevelFields), "'<i8i8i8i8'"},
	} {
		src, _ := files.ReadFile(tc.script)
		header := strings.SplitN(string(src), "\n\n", 2)[0]
		if !strings.Contains(header, tc.says) {
			t.Errorf("%s: the header does not say %q", tc.script, tc.says)
		}
		if !strings.Contains(string(src), tc.code) {
			t.Errorf("%s: the code does not read %q", tc.script, tc.code)
		}
	}
}
