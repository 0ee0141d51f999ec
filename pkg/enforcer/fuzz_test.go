package enforcer

import (
	"encoding/binary"
	"errors"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/config/samples"
	"github.com/quotaplane/quotaplane/pkg/policy"
	"github.com/quotaplane/quotaplane/pkg/policy/policytest"
)

// FuzzDecide drives the engine on the sample plane with an arbitrary
// sequence of requests, times (forwards and backwards) and policy swaps, and
// checks that every answer is well formed: no panic, an error only of the
// documented kinds, a level on every denial and none on an admission, a
// RetryAfter in (0, MaxRetryAfter] on every denial, no negative Remaining.
func FuzzDecide(f *testing.F) {
	p, err := policy.LoadFS(samples.FS)
	if err != nil {
		f.Fatal(err)
	}
	alt := policytest.Compile(f, planeHeader+`
  global: {rate: 5, burst: 7}
  fairness: wfq
  tiers: [{name: free, tenant: {rate: 1, burst: 3}, key: {rate: 2, period: 1s, algorithm: slidingWindow}}]
`)
	f.Add([]byte("whale-1\x00read\x00k\x00\x01\x00\x00\x00\x10"))
	f.Add([]byte("free-trial\x00export\x00k1\x00\x00\xff\xff\xff\xff\x00acme\x00write\x00acme-batch\x00\x03\x00\x00\x01\x00"))
	names := []string{"whale-1", "whale-2", "acme", "globex", "initech", "free-trial", "nobody", ""}
	endpoints := []string{"read", "write", "export", "other"}
	keys := []string{"k", "acme-batch", "acme-partner", ""}
	f.Fuzz(func(t *testing.T, data []byte) {
		e := newEngine(t, p, WithMaxTenants(4), WithMaxKeysPerTenant(2), withFairnessInterval(time.Millisecond))
		now := epoch
		for len(data) >= 8 {
			op, step := data[0], int64(int32(binary.LittleEndian.Uint32(data[4:8])))
			now = now.Add(time.Duration(step) * time.Microsecond)
			r := Request{
				Tenant:   names[int(data[1])%len(names)],
				Endpoint: endpoints[int(data[2])%len(endpoints)],
				APIKey:   keys[int(data[3])%len(keys)],
				Units:    int64(op % 7),
			}
			data = data[8:]
			if op%31 == 0 {
				next := p
				if op%2 == 0 {
					next = alt
				}
				if err := e.SetPolicyAt(now, next); err != nil {
					t.Fatal(err)
				}
				continue
			}
			d, err := e.DecideAt(now, r)
			switch {
			case err != nil:
				if !errors.Is(err, ErrInvalidRequest) && !errors.Is(err, ErrUnknownTenant) && !errors.Is(err, ErrUnknownEndpoint) {
					t.Fatalf("%+v: unexpected error %v", r, err)
				}
			case d.Allow && (d.Level != LevelNone || d.RetryAfter != 0):
				t.Fatalf("%+v: admitted with %+v", r, d)
			case !d.Allow && (d.Level.index() < 0 || d.RetryAfter <= 0 || d.RetryAfter > MaxRetryAfter || d.Reason == ""):
				t.Fatalf("%+v: denial %+v lacks a level, a reason or a RetryAfter in (0, %v]", r, d, MaxRetryAfter)
			case d.Remaining < 0 || d.Cost < 1:
				t.Fatalf("%+v: %+v", r, d)
			}
			if _, ok := e.TenantStatusAt(now, r.Tenant); !ok && err == nil && e.tenants.get(overflowName) == nil {
				t.Fatalf("%+v decided but neither the tenant nor the overflow state has a status", r)
			}
		}
	})
}
