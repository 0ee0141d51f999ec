package store_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/pkg/poll"
	"github.com/quotaplane/quotaplane/pkg/redistest"
	"github.com/quotaplane/quotaplane/pkg/store"
)

func TestEnforcerReports(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	s := newStore(t, c)
	ctx := context.Background()
	if err := s.Report(ctx, "a", 3, 1250.5, time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := s.Report(ctx, "b", 4, 0, time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if err := s.Report(ctx, "bad:id", 1, 0, time.Minute); err == nil {
		t.Fatal("an id with ':' was accepted")
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		live, err := s.Enforcers(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(live) == 1 {
			if live[0].ID != "a" || live[0].PolicyVersion != 3 || live[0].DecisionsPerSec != 1250.5 {
				t.Fatalf("report %+v", live[0])
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("reports %+v: b's should have lapsed", live)
		}
	}
	// A later report drops the lapsed ones from Redis.
	if err := s.Report(ctx, "a", 5, 10, time.Minute); err != nil {
		t.Fatal(err)
	}
	if n, err := c.HLen(ctx, store.EnforcersKey(s.Plane())).Result(); err != nil || n != 1 {
		t.Fatalf("the reports hash holds %d fields (%v), want 1", n, err)
	}
}

// TestEnforcerStates: a report carries the enforcer's mode and degraded
// state; its value keeps the three fields earlier readers parse (they drop
// anything else from the hash), and a report an earlier enforcer wrote,
// without a state, still reads. A lapsed report's state goes with it.
func TestEnforcerStates(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	s := newStore(t, c)
	ctx := context.Background()
	if err := s.ReportState(ctx, store.EnforcerReport{ID: "a", PolicyVersion: 7, DecisionsPerSec: 3, Mode: "central", Degraded: true}, time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := s.ReportState(ctx, store.EnforcerReport{ID: "b", PolicyVersion: 6, Mode: "local-reconciled"}, time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := s.ReportState(ctx, store.EnforcerReport{ID: "c", Mode: "bad:mode"}, time.Minute); err == nil {
		t.Fatal("a mode with ':' was accepted")
	}
	// An earlier enforcer's report: the value alone.
	until := time.Now().Add(time.Minute).UnixMilli()
	if err := c.HSet(ctx, store.EnforcersKey(s.Plane()), "old", fmt.Sprintf("5:1.5:%d", until)).Err(); err != nil {
		t.Fatal(err)
	}
	live, err := s.Enforcers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := make([]string, len(live))
	for i, r := range live {
		got[i] = fmt.Sprintf("%s v%d %g %q degraded=%v", r.ID, r.PolicyVersion, r.DecisionsPerSec, r.Mode, r.Degraded)
	}
	want := []string{`a v7 3 "central" degraded=true`, `b v6 0 "local-reconciled" degraded=false`, `old v5 1.5 "" degraded=false`}
	if !slices.Equal(got, want) {
		t.Fatalf("reports\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	for id, value := range c.HGetAll(ctx, store.EnforcersKey(s.Plane())).Val() {
		if n := len(strings.Split(value, ":")); n != 3 {
			t.Fatalf("report %s is %q: %d fields, which an earlier reader deletes as garbage", id, value, n)
		}
	}

	// b lapses; its state is dropped with it at the next report, and a
	// report without a mode clears a's state.
	if err := s.ReportState(ctx, store.EnforcerReport{ID: "b", Mode: "central"}, time.Millisecond); err != nil {
		t.Fatal(err)
	}
	waitUntil := time.Now().Add(waitTimeout)
	for {
		live, err := s.Enforcers(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(live) == 2 {
			break
		}
		if time.Now().After(waitUntil) {
			t.Fatalf("reports %+v: b's should have lapsed", live)
		}
	}
	if err := s.Report(ctx, "a", 8, 0, time.Minute); err != nil {
		t.Fatal(err)
	}
	if states := c.HGetAll(ctx, store.EnforcerStatesKey(s.Plane())).Val(); len(states) != 0 {
		t.Fatalf("states left: %v; want b's dropped with its report and a's cleared", states)
	}
	live, _ = s.Enforcers(ctx)
	if len(live) != 2 || live[0].ID != "a" || live[0].Mode != "" || live[0].PolicyVersion != 8 {
		t.Fatalf("reports %+v; want a at version 8 without a state, and old", live)
	}
}

// TestShortReportKeepsTheOthers: a report with a short ttl lapses alone.
// The reports' hash lived as long as the last report asked, so one with a
// ttl of 1 ms took every other enforcer's report with it 2 ms later.
func TestShortReportKeepsTheOthers(t *testing.T) {
	srv := redistest.Start(t)
	s := newStore(t, srv.Client())
	ctx := context.Background()
	if err := s.Report(ctx, "a", 1, 0, time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := s.ReportState(ctx, store.EnforcerReport{ID: "b", Mode: "central"}, time.Millisecond); err != nil {
		t.Fatal(err)
	}
	var live []store.EnforcerReport
	poll.Until(t, waitTimeout, "b's report lapses", func() bool {
		var err error
		if live, err = s.Enforcers(ctx); err != nil {
			t.Fatal(err)
		}
		return !slices.ContainsFunc(live, func(r store.EnforcerReport) bool { return r.ID == "b" })
	})
	if len(live) != 1 || live[0].ID != "a" {
		t.Fatalf("reports %+v; want a's alone (b's lapsed)", live)
	}
}
