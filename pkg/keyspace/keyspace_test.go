package keyspace

import "testing"

// TestNames pins every key name: deployments hold keys under these names,
// so a change is a migration (the tenant hash of version 2 is one, and its
// levels' Names are version 1's keys, which scripts read to migrate).
func TestNames(t *testing.T) {
	p := PlanePrefix("ns/main")
	h := Holder("acme")
	d := KeyDigest("secret")
	for _, tc := range []struct{ got, want string }{
		{Policy("ns/main"), "qp:{ns/main}:policy"},
		{Enforcers("ns/main"), "qp:{ns/main}:enforcers"},
		{EnforcerStates("ns/main"), "qp:{ns/main}:enforcers:state"},
		{UpstreamPlan("ns/main"), "qp:{ns/main}:upstream:plan"},
		{UpstreamNodes("ns/main"), "qp:{ns/main}:upstream:nodes"},
		{UpstreamDemand("ns/main", "db"), "qp:{ns/main}:upstream:db:demand"},
		{UpstreamReports("ns/main", "db"), "qp:{ns/main}:upstream:db:reports"},
		{UpstreamUsage("ns/main", "n1"), "qp:{ns/main}:upstream:usage:n1"},
		{string(ShardPrefix("ns/main", 2)), "qp:{ns/main/2}:"},
		{p.Global(), "qp:{ns/main}:g"},
		{p.Pool(), "qp:{ns/main}:pool"},
		{p.Demand(), "qp:{ns/main}:d"},
		{p.Nodes(), "qp:{ns/main}:nodes"},
		{p.Reconcile(), "qp:{ns/main}:rc"},
		{p.TenantDemands("n1"), "qp:{ns/main}:td:n1"},
		{p.FairReport("n1"), "qp:{ns/main}:fd:n1"},
		{h, "4:acme"},
		{d, "2bb80d537b1da3e38bd30361aa855686"},
		{p.TenantHash(h), "qp:{ns/main}:h:4:acme"},
		{p.Key(h, d, false).Key, "qp:{ns/main}:k:4:acme:" + d},
		{p.Key(h, d, true).Key, "qp:{ns/main}:k:4:acme:" + d + ":w"},
		{p.Tenant(h, true).Key, "qp:{ns/main}:t:4:acme:w"},
		{p.Endpoint(h, "read", true).Key, "qp:{ns/main}:e:4:acme:read:w"},
		{DemandRecord(p.Endpoint(h, "read", false)), "qp:{ns/main}:e:4:acme:read:n"},
		{DemandRecord(p.Key(h, d, true)), "qp:{ns/main}:k:4:acme:" + d + ":w:n"},
	} {
		if tc.got != tc.want {
			t.Errorf("got %q, want %q", tc.got, tc.want)
		}
	}
	// The buckets in a tenant's hash, and where version 1 kept them.
	for _, tc := range []struct {
		level       Level
		field, name string
	}{
		{p.Tenant(h, false), "t", "qp:{ns/main}:t:4:acme"},
		{p.Allowance(h), "a", "qp:{ns/main}:a:4:acme"},
		{p.Share(h), "s", "qp:{ns/main}:s:4:acme"},
		{p.Endpoint(h, "read", false), "e:read", "qp:{ns/main}:e:4:acme:read"},
	} {
		if tc.level.Key != p.TenantHash(h) || tc.level.Field != tc.field || tc.level.Name != tc.name {
			t.Errorf("%+v: want field %q of %s, version 1's %s", tc.level, tc.field, p.TenantHash(h), tc.name)
		}
	}
}
