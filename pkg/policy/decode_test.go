package policy_test

import (
	"bytes"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/pkg/policy"
)

func TestDecodeRoundTrip(t *testing.T) {
	p := mustCompile(t, realisticObjects()...).WithVersion(1234)
	q, err := policy.Decode(p.Encode())
	if err != nil {
		t.Fatalf("Decode: %v", err)
	}
	if q.Version() != 1234 {
		t.Errorf("version = %d, want 1234", q.Version())
	}
	if q.Hash() != p.Hash() {
		t.Errorf("hash = %s, want %s", q.Hash(), p.Hash())
	}
	if !reflect.DeepEqual(q.Spec(), p.Spec()) {
		t.Errorf("spec differs after the round trip:\n%+v\nwant\n%+v", *q.Spec(), *p.Spec())
	}
	if !bytes.Equal(q.Encode(), p.Encode()) {
		t.Error("re-encoding the decoded policy gives other bytes")
	}
	// The indexes are rebuilt: lookups work on the decoded policy.
	tenant, ok := q.Tenant("tenant-37")
	if !ok || !tenant.Known || tenant.Tier != "silver" {
		t.Errorf("decoded Tenant(tenant-37) = %+v, %v", tenant, ok)
	}
	if i, ok := q.EndpointIndex("search"); !ok || q.Endpoints()[i].Name != "search" {
		t.Errorf("decoded EndpointIndex(search) = %d, %v", i, ok)
	}
	if !q.MayBorrow(&tenant) {
		t.Error("decoded policy lost the burst pool's tier list")
	}
}

func TestDecodeRoundTripOfAMinimalPlane(t *testing.T) {
	p := mustCompile(t, newPlane())
	q, err := policy.Decode(p.Encode())
	if err != nil {
		t.Fatalf("Decode: %v", err)
	}
	if q.Version() != 0 || q.Hash() != p.Hash() || !reflect.DeepEqual(q.Spec(), p.Spec()) {
		t.Errorf("round trip of a plane without endpoints, tenants or pool changed it:\n%s\nwant\n%s", q.Encode(), p.Encode())
	}
}

func TestDecodeRejectsTamperedContent(t *testing.T) {
	p := mustCompile(t, newPlane())
	enc := p.Encode()
	tests := []struct {
		name, old, new string
	}{
		{"global rate edited", `"global":{"rate":10000,`, `"global":{"rate":10001,`},
		{"tier weight edited", `"name":"silver","weight":4,`, `"name":"silver","weight":5,`},
		{"recorded hash edited", `"hash":"` + p.Hash()[:8], `"hash":"00000000`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if !bytes.Contains(enc, []byte(tt.old)) {
				t.Fatalf("encoding does not contain %s:\n%s", tt.old, enc)
			}
			tampered := bytes.Replace(enc, []byte(tt.old), []byte(tt.new), 1)
			q, err := policy.Decode(tampered)
			if err == nil {
				t.Fatalf("Decode accepted tampered content (hash %s)", q.Hash())
			}
			if !strings.Contains(err.Error(), "does not match the recorded hash") {
				t.Errorf("error = %v, want a hash mismatch", err)
			}
		})
	}
}

func TestDecodeRejectsMalformedInput(t *testing.T) {
	p := mustCompile(t, newPlane())
	enc := string(p.Encode())
	tests := []struct {
		name string
		data string
		want string
	}{
		{"empty", "", "decode policy"},
		{"not JSON", "version: 1", "decode policy"},
		{"truncated", enc[:len(enc)-10], "decode policy"},
		{"trailing data", enc + "{}", "decode policy"},
		{"no spec", `{"version":1,"hash":"x"}`, "decode policy spec"},
		{"null spec", `{"version":1,"hash":"x","spec":null}`, "spec has 0 tiers"},
		{"unknown field in spec", strings.Replace(enc, `"plane":"main",`, `"plane":"main","owner":"me",`, 1), `unknown field "owner"`},
		{"unknown field in a tier", strings.Replace(enc, `"name":"gold",`, `"name":"gold","color":"yellow",`, 1), `unknown field "color"`},
		{"unknown field in a limit", strings.Replace(enc, `"global":{"rate":10000,`, `"global":{"rate":10000,"burts":1,`, 1), `unknown field "burts"`},
		{"wrong type", strings.Replace(enc, `"global":{"rate":10000,`, `"global":{"rate":"10000",`, 1), "decode policy spec"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q, err := policy.Decode([]byte(tt.data))
			if err == nil {
				t.Fatalf("Decode accepted it (hash %s)", q.Hash())
			}
			if q != nil {
				t.Errorf("Decode returned a policy with error %v", err)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error = %v, want it to contain %q", err, tt.want)
			}
		})
	}
}

func TestDecodeRejectsSpecsThatBreakInvariants(t *testing.T) {
	base := mustCompile(t, realisticObjects()...)
	if len(base.Spec().Tenants) < 2 || len(base.Spec().Endpoints) < 2 {
		t.Fatal("the realistic plane needs at least two tenants and endpoints")
	}
	tests := []struct {
		name   string
		mutate func(s *policy.Spec)
		want   string
	}{
		{"unsorted tenants", func(s *policy.Spec) {
			s.Tenants[0], s.Tenants[1] = s.Tenants[1], s.Tenants[0]
		}, "sorted by name"},
		{"unsorted endpoints", func(s *policy.Spec) {
			s.Endpoints[0], s.Endpoints[1] = s.Endpoints[1], s.Endpoints[0]
		}, "sorted by name"},
		{"unsorted keys", func(s *policy.Spec) {
			k := s.Tenants[0].Keys
			k[0], k[1] = k[1], k[0]
		}, "keys must be sorted"},
		{"tenant in an unknown tier", func(s *policy.Spec) { s.Tenants[3].Tier = "platinum" }, `tier "platinum" is not a tier`},
		{"tenant weight zero", func(s *policy.Spec) { s.Tenants[3].Weight = 0 }, "weight 0 < 1"},
		{"unknown default tier", func(s *policy.Spec) { s.DefaultTier = "platinum" }, `default tier "platinum" is not a tier`},
		{"no tiers", func(s *policy.Spec) { s.Tiers = nil }, "spec has 0 tiers"},
		{"more than MaxTiers tiers", func(s *policy.Spec) {
			for i := range policy.MaxTiers - 2 {
				s.Tiers = append(s.Tiers, policy.Tier{Name: fmt.Sprintf("z%02d", i), Weight: 1})
			}
		}, "spec has 17 tiers; a plane has 1 to 16"},
		{"global rate above MaxRate", func(s *policy.Spec) { s.Global.Rate = policy.MaxRate + 1 }, "global: rate 1000000001 out of range"},
		{"tier limit burst zero", func(s *policy.Spec) { s.Tiers[1].Tenant.Burst = 0 }, "tier silver: burst 0 out of range"},
		{"tier key limit with unknown algorithm", func(s *policy.Spec) { s.Tiers[0].Key.Algorithm = "leaky" }, `unknown algorithm "leaky"`},
		{"endpoint cost zero", func(s *policy.Spec) { s.Endpoints[0].Cost = 0 }, "cost 0 out of range"},
		{"endpoint cost above MaxCost", func(s *policy.Spec) { s.Endpoints[0].Cost = policy.MaxCost + 1 }, "out of range"},
		{"endpoint tier limit period below MinPeriod", func(s *policy.Spec) {
			e := &s.Endpoints[4] // write
			e.Tiers[0].Limit.Period = time.Microsecond
		}, "endpoint write: period 1µs must be a whole number of microseconds"},
		{"sub-microsecond period", func(s *policy.Spec) { s.Global.Period = time.Second + 1 }, "whole number of microseconds"},
		{"period above MaxPeriod", func(s *policy.Spec) { s.Global.Period = policy.MaxPeriod + time.Millisecond }, "whole number of microseconds"},
		{"scaled level above 2^53", func(s *policy.Spec) {
			s.Global = policy.Limit{Rate: 1, Burst: 1 << 29, Period: (1<<24 + 1) * time.Microsecond, Algorithm: policy.TokenBucket}
		}, "too large"},
		{"sliding window rate above its maximum", func(s *policy.Spec) {
			s.Tenants[0].Limit = &policy.Limit{Rate: policy.MaxSlidingWindowRate + 1, Burst: 1, Period: time.Second, Algorithm: policy.SlidingWindow}
		}, "sliding window rate 10001 out of range"},
		{"tenant key limit negative rate", func(s *policy.Spec) { s.Tenants[0].Keys[0].Limit.Rate = -1 }, "tenant tenant-00: rate -1 out of range"},
		{"tenant endpoint limit burst too large", func(s *policy.Spec) {
			s.Tenants[37].Endpoints[0].Limit.Burst = policy.MaxRate + 1 // tenant-37 overrides export and write
		}, "tenant tenant-37: burst 1000000001 out of range"},
		{"duplicate tenants", func(s *policy.Spec) { s.Tenants[1] = s.Tenants[0] }, "without duplicates"},
		{"duplicate endpoints", func(s *policy.Spec) { s.Endpoints[1] = s.Endpoints[0] }, "without duplicates"},
		{"duplicate keys", func(s *policy.Spec) { s.Tenants[0].Keys[1] = s.Tenants[0].Keys[0] }, "tenant tenant-00: keys must be sorted, without duplicates"},
		{"tiers out of priority order", func(s *policy.Spec) { s.Tiers[0], s.Tiers[1] = s.Tiers[1], s.Tiers[0] }, "priority order"},
		{"tiers of equal weight out of name order", func(s *policy.Spec) {
			s.Tiers[0].Weight, s.Tiers[1].Weight = 4, 4 // gold, silver: equal weights sort by name
			s.Tiers[0], s.Tiers[1] = s.Tiers[1], s.Tiers[0]
		}, "priority order"},
		{"tier defined twice", func(s *policy.Spec) { s.Tiers[2].Name = "gold" }, "tier gold is defined twice"},
		{"tier weight zero", func(s *policy.Spec) { s.Tiers[2].Weight = 0 }, "tier bronze: weight 0"},
		{"tier floor negative", func(s *policy.Spec) { s.Tiers[2].FloorPercent = -1 }, "floorPercent -1"},
		{"tier floors above 100", func(s *policy.Spec) { s.Tiers[0].FloorPercent = 71 }, "floors add up to 101%"},
		{"pool ceiling above size", func(s *policy.Spec) { s.BurstPool.PerTenantCeiling = s.BurstPool.Size + 1 }, "burst pool"},
		{"pool size zero", func(s *policy.Spec) { s.BurstPool.Size = 0 }, "burst pool"},
		{"pool negative refill", func(s *policy.Spec) { s.BurstPool.RefillRate = -1 }, "burst pool"},
		{"tier priorityBase above 100", func(s *policy.Spec) { s.Tiers[1].PriorityBase = ptr[int64](101) }, "tier silver: priorityBase 101 out of range"},
		{"tier priorityBase negative", func(s *policy.Spec) { s.Tiers[1].PriorityBase = ptr[int64](-1) }, "tier silver: priorityBase -1 out of range"},
		{"tier priorityBase spelling out its rank's default", func(s *policy.Spec) { s.Tiers[1].PriorityBase = ptr[int64](40) }, "or its rank's default"},
		{"tenant priority empty", func(s *policy.Spec) { s.Tenants[2].Priority = &policy.Priority{} }, "priority {ContractValue:0 Realtime:false Importance:0} empty"},
		{"tenant importance above 100", func(s *policy.Spec) { s.Tenants[2].Priority = &policy.Priority{Importance: 101} }, "out of range"},
		{"tenant contract value negative", func(s *policy.Spec) { s.Tenants[2].Priority = &policy.Priority{ContractValue: -1} }, "out of range"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			spec := cloneSpec(t, base.Spec())
			tt.mutate(spec)
			q, err := policy.Decode(encodeSpec(t, 1, spec))
			if err == nil {
				t.Fatalf("Decode accepted the spec (hash %s)", q.Hash())
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error = %v, want it to contain %q", err, tt.want)
			}
		})
	}
}

func TestDecodeAcceptsAValidHandWrittenSpec(t *testing.T) {
	// encodeSpec must produce what Decode accepts, or the invariant table
	// above would pass for the wrong reason.
	p := mustCompile(t, realisticObjects()...)
	q, err := policy.Decode(encodeSpec(t, 5, cloneSpec(t, p.Spec())))
	if err != nil {
		t.Fatalf("Decode: %v", err)
	}
	if q.Hash() != p.Hash() || q.Version() != 5 {
		t.Errorf("hash %s version %d, want %s 5", q.Hash(), q.Version(), p.Hash())
	}
}
