package policy_test

import (
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/quotaplane/quotaplane/api/v1alpha1"
	"github.com/quotaplane/quotaplane/pkg/policy"
)

// wantProblem is a problem a test expects: exactly this object and field, and
// a message that contains every one of words.
type wantProblem struct {
	Kind, Namespace, Name, Field string
	Words                        []string
}

func planeProblem(field string, words ...string) wantProblem {
	return wantProblem{Kind: "QuotaPlane", Namespace: testNS, Name: "main", Field: field, Words: words}
}

func tenantProblem(name, field string, words ...string) wantProblem {
	return wantProblem{Kind: "TenantQuota", Namespace: testNS, Name: name, Field: field, Words: words}
}

func endpointProblem(name, field string, words ...string) wantProblem {
	return wantProblem{Kind: "EndpointQuota", Namespace: testNS, Name: name, Field: field, Words: words}
}

func poolProblem(name, field string, words ...string) wantProblem {
	return wantProblem{Kind: "BurstPool", Namespace: testNS, Name: name, Field: field, Words: words}
}

func checkProblems(t *testing.T, got []policy.Problem, want []wantProblem) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("got %d problems, want %d:\n%s", len(got), len(want), problemList(got))
	}
	for i, w := range want {
		g := got[i]
		if g.Kind != w.Kind || g.Namespace != w.Namespace || g.Name != w.Name || g.Field != w.Field {
			t.Errorf("problem %d is about %s %s/%s %q, want %s %s/%s %q\n  message: %s",
				i, g.Kind, g.Namespace, g.Name, g.Field, w.Kind, w.Namespace, w.Name, w.Field, g.Message)
		}
		for _, word := range w.Words {
			if !strings.Contains(g.Message, word) {
				t.Errorf("problem %d message %q does not contain %q", i, g.Message, word)
			}
		}
	}
}

func withPlane(mut func(*v1alpha1.QuotaPlane)) []runtime.Object {
	return objects(newPlane(mut), newTenant("good", "good", "gold"))
}

// TestPlaneProblemsYieldNoPolicy covers every problem of the plane as a whole:
// each leaves Compile without a policy, so the last good one stays in force.
func TestPlaneProblemsYieldNoPolicy(t *testing.T) {
	tests := []struct {
		name string
		objs []runtime.Object
		want []wantProblem
	}{
		{
			name: "no objects",
			objs: nil,
			want: []wantProblem{{Kind: "QuotaPlane", Words: []string{"the plane has no QuotaPlane", "create one that sets the global limit and the tiers"}}},
		},
		{
			name: "no QuotaPlane",
			objs: objects(newTenant("good", "good", "gold"), newEndpoint("read", "read")),
			want: []wantProblem{{Kind: "QuotaPlane", Namespace: testNS, Words: []string{"has no QuotaPlane", "create one"}}},
		},
		{
			name: "two QuotaPlanes",
			objs: objects(newPlane(func(qp *v1alpha1.QuotaPlane) { qp.Name = "second" }), newPlane(), newTenant("good", "good", "gold")),
			want: []wantProblem{
				planeProblem("", "found 2 QuotaPlanes (quota/main, quota/second)", "exactly one plane", "delete all but one"),
				{Kind: "QuotaPlane", Namespace: testNS, Name: "second", Words: []string{"found 2 QuotaPlanes (quota/main, quota/second)", "delete all but one"}},
			},
		},
		{
			name: "two QuotaPlanes in different namespaces",
			objs: objects(newPlane(), newPlane(func(qp *v1alpha1.QuotaPlane) { qp.Namespace = "other" })),
			want: []wantProblem{
				{Kind: "QuotaPlane", Namespace: "other", Name: "main", Words: []string{"found 2 QuotaPlanes (other/main, quota/main)", "delete all but one"}},
				planeProblem("", "found 2 QuotaPlanes (other/main, quota/main)"),
			},
		},
		{
			name: "global rate negative",
			objs: withPlane(func(qp *v1alpha1.QuotaPlane) { qp.Spec.Global.Rate = -1 }),
			want: []wantProblem{planeProblem("spec.global.rate", "rate -1 is out of range", "use 0 to 1000000000 tokens per period")},
		},
		{
			name: "global burst too large",
			objs: withPlane(func(qp *v1alpha1.QuotaPlane) { qp.Spec.Global.Burst = policy.MaxRate + 1 }),
			want: []wantProblem{planeProblem("spec.global.burst", "burst 1000000001 is out of range", "use 1 to 1000000000")},
		},
		{
			name: "global sliding window",
			objs: withPlane(func(qp *v1alpha1.QuotaPlane) {
				qp.Spec.Global = v1alpha1.Limit{Rate: 100, Algorithm: v1alpha1.SlidingWindow}
			}),
			want: []wantProblem{planeProblem("spec.global.algorithm", "global limit must be a tokenBucket")},
		},
		{
			name: "global unknown algorithm",
			objs: withPlane(func(qp *v1alpha1.QuotaPlane) { qp.Spec.Global.Algorithm = "leakyBucket" }),
			want: []wantProblem{planeProblem("spec.global.algorithm", `"leakyBucket" is not an algorithm`, "use tokenBucket or slidingWindow")},
		},
		{
			name: "global period too large for its burst",
			objs: withPlane(func(qp *v1alpha1.QuotaPlane) { qp.Spec.Global.Period = dur(24 * time.Hour * 365) }),
			want: []wantProblem{planeProblem("spec.global", "burst 20000 × period 8760h0m0s is too large", "shorten the period or lower the burst")},
		},
		{
			name: "no tiers",
			objs: objects(newPlane(func(qp *v1alpha1.QuotaPlane) { qp.Spec.Tiers = nil })),
			want: []wantProblem{planeProblem("spec.tiers", "needs at least one tier", "{name: standard, weight: 1}")},
		},
		{
			name: "more than MaxTiers tiers",
			objs: withPlane(func(qp *v1alpha1.QuotaPlane) {
				for i := range policy.MaxTiers - 2 {
					qp.Spec.Tiers = append(qp.Spec.Tiers, v1alpha1.Tier{Name: fmt.Sprintf("extra-%02d", i)})
				}
			}),
			want: []wantProblem{planeProblem("spec.tiers", "a plane has at most 16 tiers, not 17", "merge some")},
		},
		{
			name: "tier without a name",
			objs: withPlane(func(qp *v1alpha1.QuotaPlane) { qp.Spec.Tiers[1].Name = "" }),
			want: []wantProblem{planeProblem("spec.tiers[1].name", "a tier needs a name")},
		},
		{
			name: "tier defined twice",
			objs: withPlane(func(qp *v1alpha1.QuotaPlane) { qp.Spec.Tiers[2].Name = "gold" }),
			want: []wantProblem{planeProblem("spec.tiers[2].name", `tier "gold" is defined twice`, "must be unique")},
		},
		{
			name: "tier weight negative",
			objs: withPlane(func(qp *v1alpha1.QuotaPlane) { qp.Spec.Tiers[0].Weight = -1 }),
			want: []wantProblem{planeProblem("spec.tiers[0].weight", "weight -1 is out of range", "use 1 to 1000000")},
		},
		{
			name: "tier weight too large",
			objs: withPlane(func(qp *v1alpha1.QuotaPlane) { qp.Spec.Tiers[0].Weight = 1_000_001 }),
			want: []wantProblem{planeProblem("spec.tiers[0].weight", "weight 1000001 is out of range", "use 1 to 1000000")},
		},
		{
			name: "tier floor negative",
			objs: withPlane(func(qp *v1alpha1.QuotaPlane) { qp.Spec.Tiers[1].FloorPercent = -1 }),
			want: []wantProblem{planeProblem("spec.tiers[1].floorPercent", "floorPercent -1 is out of range", "use 0 to 100")},
		},
		{
			name: "tier floor above 100",
			objs: withPlane(func(qp *v1alpha1.QuotaPlane) {
				qp.Spec.Tiers[0].FloorPercent, qp.Spec.Tiers[1].FloorPercent, qp.Spec.Tiers[2].FloorPercent = 101, 0, 0
			}),
			want: []wantProblem{
				planeProblem("spec.tiers", "add up to 101%"),
				planeProblem("spec.tiers[0].floorPercent", "floorPercent 101 is out of range", "use 0 to 100"),
			},
		},
		{
			name: "tier floors add up to more than 100",
			objs: withPlane(func(qp *v1alpha1.QuotaPlane) { qp.Spec.Tiers[0].FloorPercent = 71 }),
			want: []wantProblem{planeProblem("spec.tiers", "tier floors add up to 101%", "at most 100% of the global limit", "lower some floorPercent")},
		},
		{
			name: "tier tenant limit",
			objs: withPlane(func(qp *v1alpha1.QuotaPlane) { qp.Spec.Tiers[1].Tenant.Burst = -5 }),
			want: []wantProblem{planeProblem("spec.tiers[1].tenant.burst", "burst -5 is out of range", "use 1 to 1000000000")},
		},
		{
			name: "tier key limit",
			objs: withPlane(func(qp *v1alpha1.QuotaPlane) { qp.Spec.Tiers[2].Key.Period = dur(500 * time.Microsecond) }),
			want: []wantProblem{planeProblem("spec.tiers[2].key.period", "period 500µs is out of range", "use 1ms to 8784h0m0s")},
		},
		{
			name: "unknown default tier",
			objs: withPlane(func(qp *v1alpha1.QuotaPlane) { qp.Spec.DefaultTier = "platinum" }),
			want: []wantProblem{planeProblem("spec.defaultTier", `tier "platinum" is not one of the plane's tiers (gold, silver, bronze)`)},
		},
		{
			name: "bad mode",
			objs: withPlane(func(qp *v1alpha1.QuotaPlane) { qp.Spec.Mode = "distributed" }),
			want: []wantProblem{planeProblem("spec.mode", `"distributed" is not valid`, "use one of local, central, local-reconciled")},
		},
		{
			name: "bad fairness",
			objs: withPlane(func(qp *v1alpha1.QuotaPlane) { qp.Spec.Fairness = "fifo" }),
			want: []wantProblem{planeProblem("spec.fairness", `"fifo" is not valid`, "use one of none, maxmin, wfq, drr")},
		},
		{
			name: "bad shareBy",
			objs: withPlane(func(qp *v1alpha1.QuotaPlane) { qp.Spec.ShareBy = "flow" }),
			want: []wantProblem{planeProblem("spec.shareBy", `"flow" is not valid`, "use one of tenant, tier")},
		},
		{
			name: "bad failure mode",
			objs: withPlane(func(qp *v1alpha1.QuotaPlane) { qp.Spec.FailureMode = "panic" }),
			want: []wantProblem{planeProblem("spec.failureMode", `"panic" is not valid`, "use one of degrade, allow, deny")},
		},
		{
			name: "bad unknownTenants",
			objs: withPlane(func(qp *v1alpha1.QuotaPlane) { qp.Spec.UnknownTenants = "allow" }),
			want: []wantProblem{planeProblem("spec.unknownTenants", `"allow" is not valid`, "use one of default, deny")},
		},
		{
			name: "bad unknownEndpoints",
			objs: withPlane(func(qp *v1alpha1.QuotaPlane) { qp.Spec.UnknownEndpoints = "Deny" }),
			want: []wantProblem{planeProblem("spec.unknownEndpoints", `"Deny" is not valid`, "use one of default, deny")},
		},
		{
			name: "reconcile interval too short",
			objs: withPlane(func(qp *v1alpha1.QuotaPlane) { qp.Spec.ReconcileInterval = dur(9 * time.Millisecond) }),
			want: []wantProblem{planeProblem("spec.reconcileInterval", "9ms is out of range", "between 10ms and 1h (default 200ms)")},
		},
		{
			name: "reconcile interval too long",
			objs: withPlane(func(qp *v1alpha1.QuotaPlane) { qp.Spec.ReconcileInterval = dur(time.Hour + time.Millisecond) }),
			want: []wantProblem{planeProblem("spec.reconcileInterval", "1h0m0.001s is out of range", "between 10ms and 1h")},
		},
		{
			name: "enforcer minReplicas negative",
			objs: withPlane(func(qp *v1alpha1.QuotaPlane) { qp.Spec.Enforcer.MinReplicas = -1 }),
			want: []wantProblem{planeProblem("spec.enforcer", "minReplicas -1 and maxReplicas 0", "must satisfy 0 <= minReplicas <= maxReplicas")},
		},
		{
			name: "enforcer maxReplicas below minReplicas",
			objs: withPlane(func(qp *v1alpha1.QuotaPlane) { qp.Spec.Enforcer.MinReplicas, qp.Spec.Enforcer.MaxReplicas = 5, 3 }),
			want: []wantProblem{planeProblem("spec.enforcer", "minReplicas 5 and maxReplicas 3", "0 <= minReplicas <= maxReplicas")},
		},
		{
			name: "enforcer maxReplicas negative",
			objs: withPlane(func(qp *v1alpha1.QuotaPlane) { qp.Spec.Enforcer.MaxReplicas = -2 }),
			want: []wantProblem{planeProblem("spec.enforcer", "minReplicas 0 and maxReplicas -2")},
		},
		{
			name: "enforcer target rate negative",
			objs: withPlane(func(qp *v1alpha1.QuotaPlane) { qp.Spec.Enforcer.TargetRatePerReplica = -1 }),
			want: []wantProblem{planeProblem("spec.enforcer.targetRatePerReplica", "must not be negative")},
		},
		{
			name: "every plane problem is reported at once",
			objs: withPlane(func(qp *v1alpha1.QuotaPlane) {
				qp.Spec.Mode = "x"
				qp.Spec.Global.Rate = -1
				qp.Spec.Tiers[0].Weight = -1
				qp.Spec.DefaultTier = "y"
			}),
			want: []wantProblem{
				planeProblem("spec.defaultTier", `tier "y"`),
				planeProblem("spec.global.rate", "rate -1"),
				planeProblem("spec.mode", `"x" is not valid`),
				planeProblem("spec.tiers[0].weight", "weight -1"),
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, problems := policy.Compile(tt.objs)
			if p != nil {
				t.Errorf("Compile returned a policy (hash %s), want none", p.Hash())
			}
			checkProblems(t, problems, tt.want)
		})
	}
}

// TestObjectProblemsLeaveTheObjectOut covers every problem of a TenantQuota,
// EndpointQuota or BurstPool: the object is left out and the rest compiles.
func TestObjectProblemsLeaveTheObjectOut(t *testing.T) {
	// Every row compiles these good objects plus its own.
	good := func(extra ...runtime.Object) []runtime.Object {
		return append(objects(newPlane(), newEndpoint("read", "read"), newTenant("good", "good", "silver")), extra...)
	}
	goodTenants, goodEndpoints := []string{"good"}, []string{"read"}
	tests := []struct {
		name          string
		objs          []runtime.Object
		want          []wantProblem
		wantTenants   []string // default goodTenants
		wantEndpoints []string // default goodEndpoints
		wantPool      bool
	}{
		{
			name: "TenantQuota with an unknown tier",
			objs: good(newTenant("bad", "bad", "platinum")),
			want: []wantProblem{tenantProblem("bad", "spec.tier", `tier "platinum" is not one of the plane's tiers`, "use one of bronze, gold, silver")},
		},
		{
			name: "TenantQuota with a bad limit",
			objs: good(newTenant("bad", "bad", "gold", func(tq *v1alpha1.TenantQuota) { tq.Spec.Limit = lim(-1, 0) })),
			want: []wantProblem{tenantProblem("bad", "spec.limit.rate", "rate -1 is out of range", "use 0 to 1000000000")},
		},
		{
			name: "TenantQuota with a weight of zero",
			objs: good(newTenant("bad", "bad", "gold", func(tq *v1alpha1.TenantQuota) { tq.Spec.Weight = new(int64) })),
			want: []wantProblem{tenantProblem("bad", "spec.weight", "weight 0 is out of range", "use 1 to 1000000")},
		},
		{
			name: "TenantQuota without a tenant id",
			objs: good(newTenant("bad", "", "gold")),
			want: []wantProblem{tenantProblem("bad", "spec.tenant", "needs the tenant id", "X-Tenant")},
		},
		{
			name: "TenantQuota with a key override without a key",
			objs: good(newTenant("bad", "bad", "gold", func(tq *v1alpha1.TenantQuota) {
				tq.Spec.Keys = []v1alpha1.KeyQuota{{Limit: *lim(1, 1)}}
			})),
			want: []wantProblem{tenantProblem("bad", "spec.keys[0].key", "needs the key")},
		},
		{
			name: "TenantQuota with a duplicate key",
			objs: good(newTenant("bad", "bad", "gold", func(tq *v1alpha1.TenantQuota) {
				tq.Spec.Keys = []v1alpha1.KeyQuota{{Key: "k1", Limit: *lim(1, 1)}, {Key: "k2", Limit: *lim(1, 1)}, {Key: "k1", Limit: *lim(2, 2)}}
			})),
			want: []wantProblem{tenantProblem("bad", "spec.keys[2].key", `api key "k1" is listed twice`)},
		},
		{
			name: "TenantQuota with a bad key limit",
			objs: good(newTenant("bad", "bad", "gold", func(tq *v1alpha1.TenantQuota) {
				tq.Spec.Keys = []v1alpha1.KeyQuota{{Key: "k1", Limit: v1alpha1.Limit{Rate: 5, Algorithm: "fixedWindow"}}}
			})),
			want: []wantProblem{tenantProblem("bad", "spec.keys[0].limit.algorithm", `"fixedWindow" is not an algorithm`, "use tokenBucket or slidingWindow")},
		},
		{
			name: "TenantQuota overriding an unknown endpoint",
			objs: good(newTenant("bad", "bad", "gold", func(tq *v1alpha1.TenantQuota) {
				tq.Spec.Endpoints = []v1alpha1.TenantEndpointQuota{{Endpoint: "read", Limit: *lim(1, 1)}, {Endpoint: "missing", Limit: *lim(1, 1)}}
			})),
			want: []wantProblem{tenantProblem("bad", "spec.endpoints[1].endpoint", `endpoint "missing" has no valid EndpointQuota in this plane`, "create one or remove this override")},
		},
		{
			name: "TenantQuota overriding an endpoint twice",
			objs: good(newTenant("bad", "bad", "gold", func(tq *v1alpha1.TenantQuota) {
				tq.Spec.Endpoints = []v1alpha1.TenantEndpointQuota{{Endpoint: "read", Limit: *lim(1, 1)}, {Endpoint: "read", Limit: *lim(2, 2)}}
			})),
			want: []wantProblem{tenantProblem("bad", "spec.endpoints[1].endpoint", `endpoint "read" is listed twice`)},
		},
		{
			name: "TenantQuota with a bad endpoint override limit",
			objs: good(newTenant("bad", "bad", "gold", func(tq *v1alpha1.TenantQuota) {
				tq.Spec.Endpoints = []v1alpha1.TenantEndpointQuota{{Endpoint: "read", Limit: *lim(1, policy.MaxRate+1)}}
			})),
			want: []wantProblem{tenantProblem("bad", "spec.endpoints[0].limit.burst", "burst 1000000001 is out of range")},
		},
		{
			name: "TenantQuota overriding an endpoint whose EndpointQuota is invalid",
			objs: good(
				newEndpoint("broken", "broken", func(eq *v1alpha1.EndpointQuota) { eq.Spec.Cost = -1 }),
				newTenant("bad", "bad", "gold", func(tq *v1alpha1.TenantQuota) {
					tq.Spec.Endpoints = []v1alpha1.TenantEndpointQuota{{Endpoint: "broken", Limit: *lim(1, 1)}}
				}),
			),
			want: []wantProblem{
				endpointProblem("broken", "spec.cost", "cost -1 is out of range", "use 1 to 1000000"),
				tenantProblem("bad", "spec.endpoints[0].endpoint", `endpoint "broken" has no valid EndpointQuota`),
			},
		},
		{
			name: "TenantQuota with several problems reports them all",
			objs: good(newTenant("bad", "bad", "platinum", func(tq *v1alpha1.TenantQuota) {
				tq.Spec.Limit = lim(1, -1)
				tq.Spec.Keys = []v1alpha1.KeyQuota{{Key: "", Limit: *lim(1, 1)}}
			})),
			want: []wantProblem{
				tenantProblem("bad", "spec.keys[0].key", "needs the key"),
				tenantProblem("bad", "spec.limit.burst", "burst -1"),
				tenantProblem("bad", "spec.tier", `tier "platinum"`),
			},
		},
		{
			name:        "two TenantQuotas for one tenant: the first by object name wins",
			objs:        good(newTenant("b-second", "shared", "bronze"), newTenant("a-first", "shared", "gold")),
			want:        []wantProblem{tenantProblem("b-second", "spec.tenant", `tenant "shared" already has TenantQuota a-first`, "merge the two objects", "one TenantQuota per tenant")},
			wantTenants: []string{"good", "shared"},
		},
		{
			name:          "two EndpointQuotas for one endpoint: the first by object name wins",
			objs:          good(newEndpoint("z-read", "read", func(eq *v1alpha1.EndpointQuota) { eq.Spec.Cost = 3 })),
			want:          []wantProblem{endpointProblem("z-read", "spec.endpoint", `endpoint "read" is already defined by EndpointQuota read`, "merge the two objects or rename this endpoint")},
			wantEndpoints: []string{"read"},
		},
		{
			name: "EndpointQuota with an unknown tier",
			objs: good(newEndpoint("bad", "bad", func(eq *v1alpha1.EndpointQuota) {
				eq.Spec.Tiers = []v1alpha1.EndpointTierLimit{{Tier: "gold", Limit: *lim(1, 1)}, {Tier: "platinum", Limit: *lim(1, 1)}}
			})),
			want: []wantProblem{endpointProblem("bad", "spec.tiers[1].tier", `tier "platinum" is not one of the plane's tiers`, "use one of bronze, gold, silver")},
		},
		{
			name: "EndpointQuota listing a tier twice",
			objs: good(newEndpoint("bad", "bad", func(eq *v1alpha1.EndpointQuota) {
				eq.Spec.Tiers = []v1alpha1.EndpointTierLimit{{Tier: "gold", Limit: *lim(1, 1)}, {Tier: "gold", Limit: *lim(2, 2)}}
			})),
			want: []wantProblem{endpointProblem("bad", "spec.tiers[1].tier", `tier "gold" is listed twice`)},
		},
		{
			name: "EndpointQuota with a tier limit out of range",
			objs: good(newEndpoint("bad", "bad", func(eq *v1alpha1.EndpointQuota) {
				eq.Spec.Tiers = []v1alpha1.EndpointTierLimit{{Tier: "gold", Limit: *limPer(1, 1, time.Second+time.Nanosecond)}}
			})),
			want: []wantProblem{endpointProblem("bad", "spec.tiers[0].limit.period", "sub-microsecond precision", "round it to whole microseconds")},
		},
		{
			name: "EndpointQuota with a slash in its name",
			objs: good(newEndpoint("bad", "v1/bad")),
			want: []wantProblem{endpointProblem("bad", "spec.endpoint", `"v1/bad" is not an endpoint name`, "POST /api/{endpoint}", "without slashes or spaces")},
		},
		{
			name: "EndpointQuota without an endpoint name",
			objs: good(newEndpoint("bad", "")),
			want: []wantProblem{endpointProblem("bad", "spec.endpoint", `"" is not an endpoint name`)},
		},
		{
			name: "EndpointQuota with a negative cost",
			objs: good(newEndpoint("bad", "bad", func(eq *v1alpha1.EndpointQuota) { eq.Spec.Cost = -1 })),
			want: []wantProblem{endpointProblem("bad", "spec.cost", "cost -1 is out of range", "use 1 to 1000000")},
		},
		{
			name: "EndpointQuota with a cost above MaxCost",
			objs: good(newEndpoint("bad", "bad", func(eq *v1alpha1.EndpointQuota) { eq.Spec.Cost = policy.MaxCost + 1 })),
			want: []wantProblem{endpointProblem("bad", "spec.cost", "cost 1000001 is out of range")},
		},
		{
			name: "EndpointQuota with a sliding window too large",
			objs: good(newEndpoint("bad", "bad", func(eq *v1alpha1.EndpointQuota) {
				eq.Spec.Limit = &v1alpha1.Limit{Rate: 20_000, Algorithm: v1alpha1.SlidingWindow}
			})),
			want: []wantProblem{endpointProblem("bad", "spec.limit.rate", "slidingWindow keeps one entry per request", "1 to 10000", "use tokenBucket for larger limits")},
		},
		{
			name:     "second BurstPool",
			objs:     good(newPool("b-pool"), newPool("a-pool")),
			want:     []wantProblem{poolProblem("b-pool", "", "the plane already has BurstPool a-pool", "at most one burst pool", "delete this one or merge them")},
			wantPool: true,
		},
		{
			name: "BurstPool ceiling above its size",
			objs: good(newPool("bad", func(bp *v1alpha1.BurstPool) { bp.Spec.PerTenantCeiling = 5001 })),
			want: []wantProblem{poolProblem("bad", "spec.perTenantCeiling", "perTenantCeiling 5001 must be between 1 and the pool size 5000")},
		},
		{
			name: "BurstPool without a ceiling",
			objs: good(newPool("bad", func(bp *v1alpha1.BurstPool) { bp.Spec.PerTenantCeiling = 0 })),
			want: []wantProblem{poolProblem("bad", "spec.perTenantCeiling", "perTenantCeiling 0 must be between 1 and the pool size")},
		},
		{
			name: "BurstPool of size zero",
			objs: good(newPool("bad", func(bp *v1alpha1.BurstPool) { bp.Spec.Size, bp.Spec.PerTenantCeiling = 0, 1 })),
			want: []wantProblem{
				poolProblem("bad", "spec.perTenantCeiling", "pool size 0"),
				poolProblem("bad", "spec.size", "size 0 is out of range", "use 1 to 1000000000 tokens"),
			},
		},
		{
			name: "BurstPool with a negative refill rate",
			objs: good(newPool("bad", func(bp *v1alpha1.BurstPool) { bp.Spec.RefillRate = -1 })),
			want: []wantProblem{poolProblem("bad", "spec.refillRate", "refillRate -1 is out of range", "use 0 to 1000000000 tokens per second")},
		},
		{
			name: "BurstPool with an unknown tier",
			objs: good(newPool("bad", func(bp *v1alpha1.BurstPool) { bp.Spec.Tiers = []string{"gold", "platinum"} })),
			want: []wantProblem{poolProblem("bad", "spec.tiers[1]", `tier "platinum" is not one of the plane's tiers`, "use one of bronze, gold, silver")},
		},
		{
			name: "objects in another namespace",
			objs: good(
				newTenant("away", "away", "gold", func(tq *v1alpha1.TenantQuota) { tq.Namespace = "other" }),
				newEndpoint("away", "away", func(eq *v1alpha1.EndpointQuota) { eq.Namespace = "other" }),
				newPool("away", func(bp *v1alpha1.BurstPool) { bp.Namespace = "other" }),
			),
			want: []wantProblem{
				{Kind: "BurstPool", Namespace: "other", Name: "away", Field: "metadata.namespace", Words: []string{`object is in namespace "other" but the plane main is in "quota"`, "all objects of a plane live in its namespace"}},
				{Kind: "EndpointQuota", Namespace: "other", Name: "away", Field: "metadata.namespace", Words: []string{`namespace "other"`}},
				{Kind: "TenantQuota", Namespace: "other", Name: "away", Field: "metadata.namespace", Words: []string{`namespace "other"`}},
			},
		},
		{
			name: "an object of another kind",
			objs: good(&metav1.Status{}),
			want: []wantProblem{{Kind: "*v1.Status", Words: []string{"not a quotaplane.io/v1alpha1 kind", "only QuotaPlane, TenantQuota, EndpointQuota, BurstPool and Upstream belong to a plane"}}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, problems := policy.Compile(tt.objs)
			checkProblems(t, problems, tt.want)
			if p == nil {
				t.Fatal("Compile returned no policy; an object's problem must not block the plane")
			}
			wantTenants, wantEndpoints := cmpOr(tt.wantTenants, goodTenants), cmpOr(tt.wantEndpoints, goodEndpoints)
			if got := tenantNames(p); !slices.Equal(got, wantTenants) {
				t.Errorf("tenants = %v, want %v", got, wantTenants)
			}
			if got := endpointNames(p); !slices.Equal(got, wantEndpoints) {
				t.Errorf("endpoints = %v, want %v", got, wantEndpoints)
			}
			if got := p.Spec().BurstPool != nil; got != tt.wantPool {
				t.Errorf("has a burst pool = %v, want %v", got, tt.wantPool)
			}
		})
	}
}

func cmpOr(s, def []string) []string {
	if s == nil {
		return def
	}
	return s
}

func TestDuplicateWinnerIsTheFirstObjectNameInAnyInputOrder(t *testing.T) {
	first := newTenant("a-first", "shared", "gold")
	second := newTenant("b-second", "shared", "bronze")
	ep1 := newEndpoint("a-export", "export", func(eq *v1alpha1.EndpointQuota) { eq.Spec.Cost = 7 })
	ep2 := newEndpoint("b-export", "export", func(eq *v1alpha1.EndpointQuota) { eq.Spec.Cost = 9 })
	pool1 := newPool("a-pool", func(bp *v1alpha1.BurstPool) { bp.Spec.Size = 100; bp.Spec.PerTenantCeiling = 10 })
	pool2 := newPool("b-pool")
	orders := map[string][]runtime.Object{
		"first objects first": objects(newPlane(), first, ep1, pool1, second, ep2, pool2),
		"first objects last":  objects(pool2, ep2, second, newPlane(), pool1, ep1, first),
	}
	for name, objs := range orders {
		t.Run(name, func(t *testing.T) {
			p, problems := policy.Compile(objs)
			checkProblems(t, problems, []wantProblem{
				poolProblem("b-pool", "", "already has BurstPool a-pool"),
				endpointProblem("b-export", "spec.endpoint", "already defined by EndpointQuota a-export"),
				tenantProblem("b-second", "spec.tenant", "already has TenantQuota a-first"),
			})
			if p == nil {
				t.Fatal("no policy")
			}
			if tenant, _ := p.Tenant("shared"); tenant.Tier != "gold" {
				t.Errorf("tenant shared is in tier %q, want gold (from a-first)", tenant.Tier)
			}
			if i, ok := p.EndpointIndex("export"); !ok || p.Endpoints()[i].Cost != 7 {
				t.Errorf("endpoint export = %+v, want cost 7 (from a-export)", p.Endpoints())
			}
			if bp := p.Spec().BurstPool; bp == nil || bp.Size != 100 {
				t.Errorf("burst pool = %+v, want size 100 (from a-pool)", bp)
			}
		})
	}
}

func TestInvalidDuplicateDoesNotShadowAValidOne(t *testing.T) {
	// The object that sorts first is invalid, so it is left out as if absent
	// and the next one for the same name is compiled.
	p, problems := policy.Compile(objects(
		newPlane(),
		newTenant("a-first", "shared", "platinum"),
		newTenant("b-second", "shared", "silver"),
		newPool("a-pool", func(bp *v1alpha1.BurstPool) { bp.Spec.Size = 0 }),
		newPool("b-pool"),
	))
	checkProblems(t, problems, []wantProblem{
		poolProblem("a-pool", "spec.perTenantCeiling", "pool size 0"),
		poolProblem("a-pool", "spec.size", "size 0"),
		tenantProblem("a-first", "spec.tier", `tier "platinum"`),
	})
	if tenant, ok := p.Tenant("shared"); !ok || tenant.Tier != "silver" {
		t.Errorf("tenant shared = %+v, %v; want the valid b-second in silver", tenant, ok)
	}
	if bp := p.Spec().BurstPool; bp == nil || bp.Size != 5000 {
		t.Errorf("burst pool = %+v, want b-pool", bp)
	}
}

func TestNoQuotaPlaneProblemNamesTheNamespaceOfTheFirstObject(t *testing.T) {
	tq := newTenant("t", "t", "gold", func(tq *v1alpha1.TenantQuota) { tq.Namespace = "team-a" })
	_, problems := policy.Compile(objects(tq))
	checkProblems(t, problems, []wantProblem{{Kind: "QuotaPlane", Namespace: "team-a", Words: []string{"no QuotaPlane"}}})
}

func TestProblemFormatting(t *testing.T) {
	tests := []struct {
		p                  policy.Problem
		wantObject, wantSt string
	}{
		{
			policy.Problem{Kind: "TenantQuota", Namespace: "team-a", Name: "acme", Field: "spec.tier", Message: "fix it"},
			"TenantQuota team-a/acme", "TenantQuota team-a/acme: spec.tier: fix it",
		},
		{
			policy.Problem{Kind: "BurstPool", Namespace: "team-a", Name: "b", Message: "delete it"},
			"BurstPool team-a/b", "BurstPool team-a/b: delete it",
		},
		{
			policy.Problem{Kind: "QuotaPlane", Message: "create one"},
			"QuotaPlane", "QuotaPlane: create one",
		},
		{
			policy.Problem{Kind: "QuotaPlane", Namespace: "team-a", Message: "create one"},
			"QuotaPlane in namespace team-a", "QuotaPlane in namespace team-a: create one",
		},
	}
	for _, tt := range tests {
		if got := tt.p.Object(); got != tt.wantObject {
			t.Errorf("Object() = %q, want %q", got, tt.wantObject)
		}
		if got := tt.p.String(); got != tt.wantSt {
			t.Errorf("String() = %q, want %q", got, tt.wantSt)
		}
		var err error = tt.p
		if got := err.Error(); got != tt.wantSt {
			t.Errorf("Error() = %q, want %q", got, tt.wantSt)
		}
	}
}

func TestPlaneDefaults(t *testing.T) {
	p := mustCompile(t, newPlane())
	s := p.Spec()
	want := policy.Spec{
		Namespace:         testNS,
		Plane:             "main",
		Mode:              "local",
		Fairness:          "maxmin",
		FailureMode:       "degrade",
		ReconcileInterval: policy.DefaultReconcileInterval,
		Shards:            1,
		DefaultTier:       "bronze",
		UnknownTenants:    "default",
		UnknownEndpoints:  "default",
		KeyBinding:        "open",
		Descriptors:       policy.Descriptors{Tenant: []string{"tenant"}, Endpoint: []string{"endpoint"}, APIKey: []string{"api_key"}},
		Global:            *tb(10000, 20000, time.Second),
		Enforcer:          policy.Enforcer{MinReplicas: 1, MaxReplicas: policy.DefaultMaxReplicas},
	}
	got := *s
	got.Tiers, got.Endpoints, got.Tenants = nil, nil, nil
	if !reflect.DeepEqual(got, want) {
		t.Errorf("spec =\n%+v\nwant\n%+v", got, want)
	}
	if s.Endpoints == nil || len(s.Endpoints) != 0 || s.Tenants == nil || len(s.Tenants) != 0 {
		t.Errorf("endpoints %#v and tenants %#v, want empty non-nil lists (encoded as [])", s.Endpoints, s.Tenants)
	}
	if p.Plane() != "main" || p.Global() != *tb(10000, 20000, time.Second) {
		t.Errorf("Plane() = %q, Global() = %+v", p.Plane(), p.Global())
	}
	if p.Version() != 0 {
		t.Errorf("version = %d, want 0 before publishing", p.Version())
	}
}

func TestEnforcerDefaults(t *testing.T) {
	tests := []struct {
		name string
		in   v1alpha1.EnforcerFleet
		want policy.Enforcer
	}{
		{"unset", v1alpha1.EnforcerFleet{}, policy.Enforcer{MinReplicas: 1, MaxReplicas: 10}},
		{"min above the default max", v1alpha1.EnforcerFleet{MinReplicas: 20}, policy.Enforcer{MinReplicas: 20, MaxReplicas: 20}},
		{"max only", v1alpha1.EnforcerFleet{MaxReplicas: 3}, policy.Enforcer{MinReplicas: 1, MaxReplicas: 3}},
		{"min equals max", v1alpha1.EnforcerFleet{MinReplicas: 4, MaxReplicas: 4}, policy.Enforcer{MinReplicas: 4, MaxReplicas: 4}},
		{
			"all set",
			v1alpha1.EnforcerFleet{DeploymentName: "enf", MinReplicas: 2, MaxReplicas: 40, TargetRatePerReplica: 50000},
			policy.Enforcer{DeploymentName: "enf", MinReplicas: 2, MaxReplicas: 40, TargetRatePerReplica: 50000},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := mustCompile(t, newPlane(func(qp *v1alpha1.QuotaPlane) { qp.Spec.Enforcer = tt.in }))
			if got := p.Spec().Enforcer; got != tt.want {
				t.Errorf("enforcer = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestPlaneBoundariesAreAccepted(t *testing.T) {
	tests := []struct {
		name string
		mut  func(*v1alpha1.QuotaPlane)
	}{
		{"floors add up to exactly 100", func(qp *v1alpha1.QuotaPlane) { qp.Spec.Tiers[0].FloorPercent = 70 }},
		{"one tier with a floor of 100", func(qp *v1alpha1.QuotaPlane) {
			qp.Spec.Tiers = []v1alpha1.Tier{{Name: "only", FloorPercent: 100}}
		}},
		{"reconcile interval at its minimum", func(qp *v1alpha1.QuotaPlane) { qp.Spec.ReconcileInterval = dur(policy.MinReconcileInterval) }},
		{"reconcile interval at its maximum", func(qp *v1alpha1.QuotaPlane) { qp.Spec.ReconcileInterval = dur(time.Hour) }},
		{"MaxTiers tiers", func(qp *v1alpha1.QuotaPlane) {
			for i := range policy.MaxTiers - 3 {
				qp.Spec.Tiers = append(qp.Spec.Tiers, v1alpha1.Tier{Name: fmt.Sprintf("extra-%02d", i)})
			}
		}},
		{"tier weight at its maximum", func(qp *v1alpha1.QuotaPlane) { qp.Spec.Tiers[0].Weight = 1_000_000 }},
		{"every enum value", func(qp *v1alpha1.QuotaPlane) {
			qp.Spec.Mode, qp.Spec.Fairness, qp.Spec.FailureMode = v1alpha1.ModeCentral, v1alpha1.FairnessNone, v1alpha1.FailureDeny
			qp.Spec.UnknownTenants, qp.Spec.UnknownEndpoints = v1alpha1.UnknownDeny, v1alpha1.UnknownDeny
		}},
		{"global with no refill", func(qp *v1alpha1.QuotaPlane) { qp.Spec.Global = v1alpha1.Limit{Burst: 10} }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			mustCompile(t, newPlane(tt.mut))
		})
	}
}

func TestShards(t *testing.T) {
	plane := newPlane()
	plane.Spec.Shards = 4
	whale := &v1alpha1.TenantQuota{ObjectMeta: metav1.ObjectMeta{Name: "whale", Namespace: testNS},
		Spec: v1alpha1.TenantQuotaSpec{Tenant: "whale", Shards: new(int32(3))}}
	single := &v1alpha1.TenantQuota{ObjectMeta: metav1.ObjectMeta{Name: "single", Namespace: testNS},
		Spec: v1alpha1.TenantQuotaSpec{Tenant: "single", Shards: new(int32(1))}}
	p := mustCompile(t, plane, whale, single)
	if p.Spec().Shards != 4 {
		t.Fatalf("plane shards %d, want 4", p.Spec().Shards)
	}
	if w, _ := p.Tenant("whale"); w.Shards != 3 {
		t.Fatalf("whale shards %d, want 3", w.Shards)
	}
	if s, _ := p.Tenant("single"); s.Shards != 0 {
		t.Fatalf("a tenant with one shard is not split: shards %d, want 0", s.Shards)
	}
	if _, err := policy.Decode(p.Encode()); err != nil {
		t.Fatalf("decode: %v", err)
	}

	tooMany := whale.DeepCopy()
	tooMany.Spec.Shards = new(int32(5))
	_, problems := policy.Compile([]runtime.Object{plane, tooMany})
	if len(problems) != 1 || problems[0].Field != "spec.shards" || !strings.Contains(problems[0].Message, "plane's shards, 4") {
		t.Fatalf("a tenant with more shards than its plane: %v", problems)
	}
	bad := newPlane()
	bad.Spec.Shards = 65
	if p, problems := policy.Compile([]runtime.Object{bad}); p != nil || len(problems) != 1 || problems[0].Field != "spec.shards" {
		t.Fatalf("65 plane shards: %v", problems)
	}
}
