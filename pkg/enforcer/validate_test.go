package enforcer

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/pkg/policy"
	"github.com/quotaplane/quotaplane/pkg/redistest"
)

// TestValidatorsMatchPolicy: the byte-wise endpoint and tier rules of
// ValidateRequest are policy.ValidEndpointName's and policy.ValidTierName's
// (regular expressions), on every string of up to 3 bytes over an alphabet
// with each class of byte and at the length bounds.
func TestValidatorsMatchPolicy(t *testing.T) {
	alphabet := []byte{'a', 'z', 'A', 'Z', '0', '9', '.', '_', '~', '-', ' ', 0, '\r', '/', ':', 0x7f, 0xc3, 0xff}
	var cases []string
	var walk func(prefix string, n int)
	walk = func(prefix string, n int) {
		cases = append(cases, prefix)
		if n == 0 {
			return
		}
		for _, c := range alphabet {
			walk(prefix+string([]byte{c}), n-1)
		}
	}
	walk("", 3)
	for _, n := range []int{61, 62, 63, 64, 127, 128, 129, 10 << 10} {
		cases = append(cases, strings.Repeat("a", n), "a"+strings.Repeat("-", n-2)+"a", strings.Repeat("a", n-1)+"-")
	}
	for _, s := range cases {
		if got, want := validEndpointName(s), policy.ValidEndpointName(s); got != want {
			t.Errorf("endpoint %q: %t, policy says %t", s, got, want)
		}
		if got, want := validTierName(s), policy.ValidTierName(s); got != want {
			t.Errorf("tier %q: %t, policy says %t", s, got, want)
		}
	}
}

// FuzzValidateRequest: ValidateRequest accepts exactly what pkg/policy's
// name rules accept, and its errors never quote the api key.
func FuzzValidateRequest(f *testing.F) {
	f.Add("acme", "export", "k1", "", int64(1))
	f.Add("acme", "Export", "", "free", int64(0))
	f.Add("a b", "export ", "k\r\n", "-x", int64(-1))
	f.Fuzz(func(t *testing.T, tenant, endpoint, key, tier string, units int64) {
		r := Request{Tenant: tenant, Endpoint: endpoint, APIKey: key, Tier: tier, Units: units}
		err := ValidateRequest(&r)
		want := policy.ValidName(tenant) && (key == "" || policy.ValidName(key)) &&
			(endpoint == "" || policy.ValidEndpointName(endpoint)) && (tier == "" || policy.ValidTierName(tier)) &&
			units >= 0 && units <= MaxUnits
		if (err == nil) != want {
			t.Fatalf("%+v: %v; the policy's rules say valid=%t", r, err, want)
		}
		if err != nil && !errors.Is(err, ErrInvalidRequest) {
			t.Fatalf("%+v: %v does not wrap ErrInvalidRequest", r, err)
		}
		if err != nil && len(key) >= 4 && strings.Contains(err.Error(), key) {
			// The message may hold the key's characters by chance (a key
			// "0000" in a range's 1000000): it quotes the key when it
			// changes with it, another key of the same validity.
			other := r
			other.APIKey = "qzqzqz"
			if !policy.ValidName(key) {
				other.APIKey = "qz\x00qz"
			}
			if err2 := ValidateRequest(&other); err2 == nil || err2.Error() != err.Error() {
				t.Fatalf("the error %q quotes the api key (with another key: %v)", err, err2)
			}
		}
	})
}

// endpointPlane is a plane whose export endpoint costs 50 and holds two
// exports an hour per tenant; with many, it names 12 endpoints (more than
// the 8 a scan handles: ResolveEndpoint's path).
func endpointPlane(many bool) string {
	var sb strings.Builder
	sb.WriteString(planeHeader + `  global: {rate: 1000, burst: 100000}
  tiers: [{name: t, weight: 1, tenant: {rate: 1000, burst: 10000}}]
---
apiVersion: quotaplane.io/v1alpha1
kind: EndpointQuota
metadata: {name: export}
spec: {endpoint: export, cost: 50, limit: {rate: 100, burst: 100, period: 1h}}
---
apiVersion: quotaplane.io/v1alpha1
kind: EndpointQuota
metadata: {name: read}
spec: {endpoint: read, cost: 1}
`)
	if many {
		for i := range 10 {
			fmt.Fprintf(&sb, "---\napiVersion: quotaplane.io/v1alpha1\nkind: EndpointQuota\nmetadata: {name: e%d}\nspec: {endpoint: e%d, cost: 2}\n", i, i)
		}
	}
	return sb.String()
}

// TestEndpointVariantsCostTheEndpoint is the regression test of endpoint
// names that bypassed limits: "Export" and "EXPORT" were unknown endpoints
// costing 1, outside the export limit. They resolve to export, cost its 50
// and meet its limit (two an hour), in every mode, with few endpoints (a
// scan) and many (the policy's index).
func TestEndpointVariantsCostTheEndpoint(t *testing.T) {
	srv := redistest.Start(t)
	for _, m := range groupModes {
		for _, many := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/many=%t", m.name, many), func(t *testing.T) {
				e := groupEngine(t, srv, m.mode, m.redisDown, endpointPlane(many))
				now := at(time.Hour)
				for i, name := range []string{"Export", "EXPORT", "eXpOrT"} {
					d := mustDecide(t, e, now, Request{Tenant: "a", Endpoint: name})
					if d.Cost != 50 || d.Allow != (i < 2) || !d.Allow && d.Level != LevelEndpoint {
						t.Fatalf("%s (export %d): %+v; want cost 50, the third denied by the export limit", name, i+1, d)
					}
				}
				if s, ok := e.TenantStatusAt(now, "a"); !ok || s.Trace[0].Endpoint != "export" {
					t.Fatalf("the trace names %+v; want export", s.Trace)
				}
				if many {
					if d := mustDecide(t, e, now, Request{Tenant: "a", Endpoint: "E7"}); d.Cost != 2 {
						t.Fatalf("E7: %+v; want e7's cost", d)
					}
				}
			})
		}
	}
}

// TestInvalidEndpointRefused is the regression test of endpoint names that
// passed unchecked: a trailing space, NUL, CR/LF and 10 KiB are refused
// with ErrInvalidRequest, name the field, never echo the value, and change
// no bucket and create no state, alone and in a group; in every mode.
func TestInvalidEndpointRefused(t *testing.T) {
	srv := redistest.Start(t)
	long := strings.Repeat("x", 10<<10)
	for _, m := range groupModes {
		t.Run(m.name, func(t *testing.T) {
			e := groupEngine(t, srv, m.mode, m.redisDown, endpointPlane(false))
			now := at(time.Hour)
			mustDecide(t, e, now, Request{Tenant: "a", Endpoint: "export"})
			before, tenants := stateAt(t, e, upRedis(e, m.redisDown), now), e.tenants.count.Load()
			for _, name := range []string{"export ", "exp\x00ort", "export\r\n", "\r\nX-Injected: 1", long, "ex/port", "exp%20ort", "éxport"} {
				for _, tenant := range []string{"a", "newcomer"} {
					r := Request{Tenant: tenant, Endpoint: name, APIKey: "k"}
					_, err := e.DecideAt(now, r)
					if !errors.Is(err, ErrInvalidRequest) || !strings.Contains(err.Error(), "endpoint") {
						t.Fatalf("%q: %v; want ErrInvalidRequest naming the endpoint", name, err)
					}
					if len(err.Error()) > 300 || strings.Contains(err.Error(), "\r") || strings.Contains(err.Error(), "\x00") {
						t.Fatalf("%q: the error echoes the value: %q", name, err)
					}
					ds := make([]Decision, 2)
					_, err = e.DecideAllAt(now, []Request{{Tenant: "a", Endpoint: "export"}, r}, ds)
					var re *RequestError
					if !errors.As(err, &re) || re.Index != 1 || !errors.Is(err, ErrInvalidRequest) {
						t.Fatalf("%q in a group: %v", name, err)
					}
				}
			}
			if after := stateAt(t, e, upRedis(e, m.redisDown), now); after != before || e.tenants.count.Load() != tenants {
				t.Fatalf("refused requests changed the state:\n%s\n%s", before, after)
			}
		})
	}
}

// TestValidateRequestFields: each field's rule, and what the error says.
func TestValidateRequestFields(t *testing.T) {
	ok := Request{Tenant: "acme", Endpoint: "export", APIKey: "k1", Tier: "free", Units: 3}
	if err := ValidateRequest(&ok); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		change func(*Request)
		says   string
	}{
		{func(r *Request) { r.Tenant = "" }, "tenant is empty"},
		{func(r *Request) { r.Tenant = "a b" }, "tenant has byte 0x20 at offset 1"},
		{func(r *Request) { r.Tenant = strings.Repeat("t", 257) }, "tenant is 257 bytes long, more than 256"},
		{func(r *Request) { r.APIKey = "secret\nkey" }, "api key has byte 0x0a at offset 6"},
		{func(r *Request) { r.Endpoint = "a:b" }, "endpoint has byte 0x3a at offset 1"},
		{func(r *Request) { r.Endpoint = strings.Repeat("e", 129) }, "endpoint is 129 bytes long, more than 128"},
		{func(r *Request) { r.Tier = "Free" }, "tier is not a tier name"},
		{func(r *Request) { r.Units = MaxUnits + 1 }, "units 1000001 out of range"},
		{func(r *Request) { r.Units = -1 }, "units -1 out of range"},
	} {
		r := ok
		tc.change(&r)
		err := ValidateRequest(&r)
		if !errors.Is(err, ErrInvalidRequest) || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%+v: %v; want it to say %q", r, err, tc.says)
		}
		if err != nil && strings.Contains(err.Error(), "secret") {
			t.Errorf("the error quotes the api key: %v", err)
		}
	}
	for _, r := range []Request{{Tenant: "a"}, {Tenant: "a", Endpoint: "E.x_~-9"}} {
		if err := ValidateRequest(&r); err != nil {
			t.Errorf("%+v: %v", r, err)
		}
	}
	if n := testing.AllocsPerRun(100, func() { _ = ValidateRequest(&ok) }); n != 0 {
		t.Errorf("ValidateRequest allocates %v times for a valid request", n)
	}
}

// BenchmarkValidateRequest validates a request with names of the lengths
// seen in the wild: a UUID tenant, a 48-byte api key.
func BenchmarkValidateRequest(b *testing.B) {
	r := Request{Tenant: "3f2b8c9e-1a4d-4e7f-9b2c-5d6e7f8a9b0c", Endpoint: "chat.completions", APIKey: "sk-live-4f3a2b1c9d8e7f6a5b4c3d2e1f0a9b8c7d6e5f4a"}
	b.ReportAllocs()
	for b.Loop() {
		if err := ValidateRequest(&r); err != nil {
			b.Fatal(err)
		}
	}
}
