package enforcer

import (
	"testing"
	"time"
	"unsafe"

	"github.com/quotaplane/quotaplane/pkg/policy/policytest"
)

// TestTraceCountsRunsOfAdmittedDecisions: admitted decisions alike in a
// row (endpoint, key, cost, loan) are one trace entry with their count;
// a denial, another endpoint or another key starts a new entry; the ring
// keeps the TraceLength newest entries.
func TestTraceCountsRunsOfAdmittedDecisions(t *testing.T) {
	e := newEngine(t, policytest.Compile(t, planeHeader+`  global: {rate: 1000000, burst: 1000000}
  tiers:
    - {name: free, tenant: {rate: 1, burst: 10}}
---
apiVersion: quotaplane.io/v1alpha1
kind: TenantQuota
metadata: {name: a}
spec: {tenant: a, tier: free}
---
apiVersion: quotaplane.io/v1alpha1
kind: EndpointQuota
metadata: {name: read}
spec: {endpoint: read, cost: 1, limit: {rate: 1000, burst: 1000}}
---
apiVersion: quotaplane.io/v1alpha1
kind: EndpointQuota
metadata: {name: write}
spec: {endpoint: write, cost: 1, limit: {rate: 1000, burst: 1000}}
`))
	now := at(time.Hour)
	decide := func(r Request, allow bool) {
		t.Helper()
		now = now.Add(time.Microsecond)
		if d := mustDecide(t, e, now, r); d.Allow != allow {
			t.Fatalf("%+v: allow %v, want %v", r, d.Allow, allow)
		}
	}
	read := Request{Tenant: "a", Endpoint: "read", APIKey: "k1"}
	for range 5 {
		decide(read, true)
	}
	// The newest run, as the ring's head holds it.
	if s, _ := e.TenantStatusAt(now, "a"); len(s.Trace) != 1 || s.Trace[0].Count != 5 || !s.Trace[0].At.Equal(now) {
		t.Fatalf("after a run of 5 the trace is %+v; want one entry of 5 at its last decision", s.Trace)
	}
	decide(Request{Tenant: "a", Endpoint: "read", APIKey: "k2"}, true)
	decide(Request{Tenant: "a", Endpoint: "write", APIKey: "k2"}, true)
	for range 3 {
		decide(read, true)
	}
	decide(read, false) // 10 tokens spent
	decide(read, false)
	want := []struct {
		count int64
		allow bool
	}{{1, false}, {1, false}, {3, true}, {1, true}, {1, true}, {5, true}}
	s, _ := e.TenantStatusAt(now, "a")
	if len(s.Trace) != len(want) {
		t.Fatalf("trace %+v; want %d entries", s.Trace, len(want))
	}
	for i, w := range want {
		if got := s.Trace[i]; got.Count != w.count || got.Allow != w.allow {
			t.Errorf("entry %d (newest first) %+v; want count %d, allow %v", i, got, w.count, w.allow)
		}
	}
	if last := s.Trace[len(s.Trace)-1]; !last.At.Equal(at(time.Hour).Add(5 * time.Microsecond)) {
		t.Errorf("the run of 5 ends at %v; want its last decision's time", last.At.Sub(epoch))
	}
	// More entries than the ring holds: the oldest go.
	for i := range TraceLength {
		decide(Request{Tenant: "a", Endpoint: "read", APIKey: sprintf("x%d", i)}, false)
	}
	if s, _ = e.TenantStatusAt(now, "a"); len(s.Trace) != TraceLength || s.Trace[TraceLength-1].Count != 1 || s.Trace[TraceLength-1].Allow {
		t.Fatalf("after %d more denials the trace is %+v; want only them", TraceLength, s.Trace)
	}
}

// TestTraceRunInOneLine: what a run of admitted decisions reads and writes
// (the run, the newest entry's fields it compares, the hashed key) is in
// the ring's first 64 bytes, before the entries.
func TestTraceRunInOneLine(t *testing.T) {
	var r traceRing
	if off := unsafe.Offsetof(r.entries); off != 64 {
		t.Fatalf("the entries start at byte %d of the ring; want 64", off)
	}
}
