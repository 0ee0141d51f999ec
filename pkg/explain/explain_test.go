package explain_test

import (
	"strings"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/pkg/explain"
)

func TestWhy(t *testing.T) {
	share := 120.0
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	v := explain.View{
		Tenant: "t-00042", Known: false, Tier: "free", Weight: 1, Backend: "central", Degraded: true,
		Limits: []explain.Limit{
			{Level: "global", Limit: "10000 per 1s (burst 20000)", Remaining: 7000},
			{Level: "tenant", Limit: "50 per 1s (burst 100)", Remaining: 0},
			{Level: "key", Name: "ab12", Limit: "50 per 1s (burst 100)", Remaining: 30},
			{Level: "endpoint", Name: "write", Limit: "50 per 1s (burst 50)", Remaining: 3},
		},
		DemandPerSec: 300, FairShare: &share, BorrowDebt: 40,
		Recent: []explain.Decision{
			{At: at.Add(time.Second), Endpoint: "read", Cost: 1, Allowed: true},
			{At: at, Endpoint: "write", Cost: 5, Level: "tenant", Reason: "tenant limit used up"},
		},
	}
	got := strings.Join(explain.Why(&v), "\n")
	for _, want := range []string{
		"the enforcer is degraded",
		"the tenant level is exhausted: 0 tokens left of 50 per 1s (burst 100)",
		// 3 tokens are less than the last denied request's 5, but that was
		// denied at another level.
		"its last denial (2026-01-02T03:04:05Z, write, cost 5) was at the tenant level: tenant limit used up",
		"it asks 300 tokens/s, above its fair share of 120 tokens/s",
		"it owes 40 tokens to the burst pool",
		"the plane does not name it: it gets the free tier's defaults",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("why lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "key level") || strings.Contains(got, "endpoint level") || strings.Contains(got, "not throttled") {
		t.Errorf("why names a level with tokens left, or says not throttled:\n%s", got)
	}

	v.Limits[1].Remaining = 2 // the tenant level refilled a little, not enough
	if got := strings.Join(explain.Why(&v), "\n"); !strings.Contains(got, "the tenant level has 2 tokens left of 50 per 1s (burst 100): fewer than the last denied request's cost, 5") {
		t.Errorf("why of a level short of the denied cost:\n%s", got)
	}

	calm := explain.View{Tenant: "acme", Known: true, Tier: "standard", Limits: []explain.Limit{{Level: "tenant", Remaining: 900}},
		Recent: []explain.Decision{{Allowed: true}}}
	if why := explain.Why(&calm); len(why) != 1 || !strings.HasPrefix(why[0], "not throttled now") {
		t.Errorf("a tenant with tokens and no denial: %q", why)
	}
}
