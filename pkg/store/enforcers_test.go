package store_test

import (
	"context"
	"testing"
	"time"

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
