package enforcer

import (
	"testing"
	"time"
)

func TestOrcScratch(t *testing.T) {
	p := compileYAML(t, planeHeader+`
  global: {rate: 1000, burst: 10}
  fairness: none
  unknownTenants: deny
  tiers: [{name: std}]
---
apiVersion: quotaplane.io/v1alpha1
kind: TenantQuota
metadata: {name: a}
spec: {tenant: a}
`)
	for _, withErr := range []bool{false, true} {
		e := newEngine(t, p)
		for i := range 10 {
			mustDecide(t, e, at(0), Request{Tenant: "a", Units: 1})
			_ = i
		}
		if withErr {
			_, err := e.DecideAt(at(5*time.Second), Request{Tenant: "nobody"})
			t.Log(err)
		}
		d := mustDecide(t, e, at(5*time.Second-4*time.Millisecond), Request{Tenant: "a", Units: 1})
		t.Logf("withErr=%v: %+v", withErr, d)
		d = mustDecide(t, e, at(5*time.Second-4*time.Millisecond), Request{Tenant: "a", Units: 1})
		t.Logf("withErr=%v: %+v", withErr, d)
	}
}
