package policy_test

import (
	"strings"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/config/samples"
	"github.com/quotaplane/quotaplane/pkg/policy"
)

func TestOverride(t *testing.T) {
	p, err := policy.LoadFS(samples.FS)
	if err != nil {
		t.Fatal(err)
	}
	p = p.WithVersion(4)
	if same, err := p.Override(policy.Overrides{}); err != nil || same != p {
		t.Fatalf("no overrides: %p, %v; want the policy itself", same, err)
	}
	q, err := p.Override(policy.Overrides{Mode: "central", Fairness: "none", ReconcileInterval: 50 * time.Millisecond,
		BurstPoolSize: 300, GlobalPerSecond: 25000})
	if err != nil {
		t.Fatal(err)
	}
	s := q.Spec()
	if s.Mode != "central" || s.Fairness != "none" || s.ReconcileInterval != 50*time.Millisecond {
		t.Errorf("mode %s, fairness %s, interval %s", s.Mode, s.Fairness, s.ReconcileInterval)
	}
	if s.BurstPool.Size != 300 || s.BurstPool.PerTenantCeiling != 300 {
		t.Errorf("pool %+v: want size 300 and the ceiling capped to it", *s.BurstPool)
	}
	if g := q.Global(); g.Rate != 25000 || g.Burst != 25000 || g.Period != time.Second {
		t.Errorf("global %v: want 25000 per 1s, its burst raised to the rate", g)
	}
	if q.Version() != 4 || q.Hash() == p.Hash() {
		t.Errorf("version %d, hash %s: want version 4 and a new hash", q.Version(), q.Hash())
	}
	for _, bad := range []policy.Overrides{{Mode: "fast"}, {Fairness: "random"}, {ReconcileInterval: time.Microsecond}, {GlobalPerSecond: -1}} {
		if _, err := p.Override(bad); err == nil || !strings.Contains(err.Error(), "default/main") {
			t.Errorf("override %+v: %v; want an error naming the plane", bad, err)
		}
	}
}
