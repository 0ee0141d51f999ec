package keyspace

import (
	"strings"
	"testing"
)

// TestNames pins every key name: deployments hold keys under these names,
// so a change is a migration.
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
		{p.Tenant(h, false), "qp:{ns/main}:t:4:acme"},
		{p.Tenant(h, true), "qp:{ns/main}:t:4:acme:w"},
		{p.Allowance(h), "qp:{ns/main}:a:4:acme"},
		{p.Share(h), "qp:{ns/main}:s:4:acme"},
		{p.Endpoint(h, "read", false), "qp:{ns/main}:e:4:acme:read"},
		{p.Endpoint(h, "read", true), "qp:{ns/main}:e:4:acme:read:w"},
		{p.Key(h, d, false), "qp:{ns/main}:k:4:acme:" + d},
		{p.Key(h, d, true), "qp:{ns/main}:k:4:acme:" + d + ":w"},
	} {
		if tc.got != tc.want {
			t.Errorf("got %q, want %q", tc.got, tc.want)
		}
	}
}

// TestRequestNamesAsOneByOne: Request names a request's levels as the
// functions of each level do, in one allocation of the bytes it needs.
func TestRequestNamesAsOneByOne(t *testing.T) {
	p := ShardPrefix("ns/main", 1)
	for _, r := range []RequestLevels{
		{Tenant: "acme"},
		{Tenant: "acme", TenantWindow: true, Allowance: true, Share: true, Endpoint: "read", EndpointWindow: true, APIKey: "secret", KeyWindow: true},
		{Tenant: string(make([]byte, 300)), Allowance: true, Endpoint: "export", APIKey: "k"},
	} {
		h := Holder(r.Tenant)
		want := [5]string{p.Tenant(h, r.TenantWindow), "", "", "", ""}
		if r.Allowance {
			want[1] = p.Allowance(h)
		}
		if r.Endpoint != "" {
			want[2] = p.Endpoint(h, r.Endpoint, r.EndpointWindow)
		}
		if r.APIKey != "" {
			want[3] = p.Key(h, KeyDigest(r.APIKey), r.KeyWindow)
		}
		if r.Share {
			want[4] = p.Share(h)
		}
		var got [5]string
		got[0], got[1], got[2], got[3], got[4] = p.Request(&r)
		if got != want {
			t.Errorf("Request(%+v) = %q, want %q", r, got, want)
		}
		if allocs := testing.AllocsPerRun(10, func() { p.Request(&r) }); allocs != 1 {
			t.Errorf("Request(%+v) allocates %v times, want once", r, allocs)
		}
		used := len(Holder(r.Tenant)) + len(strings.Join(got[:], ""))
		if r.APIKey != "" {
			used += len(KeyDigest(r.APIKey))
		}
		if n := p.requestLen(&r); n != used {
			t.Errorf("Request(%+v) sizes its buffer %d bytes, uses %d", r, n, used)
		}
	}
}
