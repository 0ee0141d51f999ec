package policy_test

import (
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/config/samples"
	"github.com/quotaplane/quotaplane/pkg/policy"
)

func TestShare(t *testing.T) {
	p, err := policy.LoadFS(samples.FS)
	if err != nil {
		t.Fatal(err)
	}
	if same, err := p.Share(1); err != nil || same != p {
		t.Fatalf("Share(1) = %p, %v; want the policy itself", same, err)
	}
	for _, bad := range []float64{0, -0.5, 1.5} {
		if _, err := p.Share(bad); err == nil {
			t.Errorf("Share(%v) succeeded", bad)
		}
	}
	q, err := p.Share(0.25)
	if err != nil {
		t.Fatal(err)
	}
	if g := q.Global(); g.Rate != 2500 || g.Burst != 5000 || g.Period != time.Second {
		t.Errorf("global share %v, want 2500 per 1s (burst 5000)", g)
	}
	free, _ := q.Tier("free")
	if free.Tenant.Rate != 13 || free.Tenant.Burst != 50 { // 50/4 rounds to 13; 100/4=25 floors at the export cost, 50
		t.Errorf("free tier's tenant share %v, want 13 per 1s (burst 50)", free.Tenant)
	}
	ep, _ := q.EndpointIndex("export")
	exp := q.Endpoints()[ep]
	for _, tl := range exp.Tiers {
		if tl.Tier == "free" && (tl.Limit.Algorithm != policy.SlidingWindow || tl.Limit.Rate != 50) {
			t.Errorf("free tier's export window share %v, want a window of 50 (the export cost)", tl.Limit)
		}
	}
	bp := q.Spec().BurstPool
	if bp.Size != 1250 || bp.RefillRate != 125 || bp.PerTenantCeiling != 250 {
		t.Errorf("pool share %+v, want size 1250, refill 125, ceiling 250", *bp)
	}
	if q.Version() != p.Version() || q.Hash() == p.Hash() {
		t.Errorf("a share keeps the version (%d, %d) and has its own hash", q.Version(), p.Version())
	}
	if _, err := policy.Decode(q.Encode()); err != nil {
		t.Fatalf("a share does not decode: %v", err)
	}
	if g := p.Global(); g.Rate != 10000 {
		t.Fatalf("Share changed the policy it shares: global %v", g)
	}
}

// TestSharePlane: only the plane-wide limits are scaled; every tier,
// endpoint and tenant limit stays whole, for local-reconciled's per-limit
// parts.
func TestSharePlane(t *testing.T) {
	p, err := policy.LoadFS(samples.FS)
	if err != nil {
		t.Fatal(err)
	}
	q, err := p.SharePlane(0.25)
	if err != nil {
		t.Fatal(err)
	}
	if g := q.Global(); g.Rate != 2500 || g.Burst != 5000 {
		t.Errorf("global share %v, want 2500 per 1s (burst 5000)", g)
	}
	if bp, whole := q.Spec().BurstPool, p.Spec().BurstPool; bp == nil || bp.Size >= whole.Size || bp.RefillRate >= whole.RefillRate {
		t.Errorf("burst pool %+v not scaled from %+v", bp, whole)
	}
	for _, name := range []string{"enterprise", "standard", "free"} {
		a, _ := p.Tier(name)
		b, _ := q.Tier(name)
		if *a.Tenant != *b.Tenant || *a.Key != *b.Key {
			t.Errorf("tier %s: %v/%v, want its limits whole %v/%v", name, b.Tenant, b.Key, a.Tenant, a.Key)
		}
	}
	for i, e := range q.Endpoints() {
		if w := p.Endpoints()[i]; (e.Limit == nil) != (w.Limit == nil) || e.Limit != nil && *e.Limit != *w.Limit {
			t.Errorf("endpoint %s: limit %v, want it whole %v", e.Name, e.Limit, w.Limit)
		}
	}
	if _, err := p.SharePlane(0); err == nil {
		t.Error("SharePlane(0) succeeded")
	}
}
