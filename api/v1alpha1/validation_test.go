package v1alpha1_test

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/quotaplane/quotaplane/api/v1alpha1"
	"github.com/quotaplane/quotaplane/pkg/policy"
	"github.com/quotaplane/quotaplane/pkg/testenv"
)

// admissionCase is one quota object sent to the API server. The CRD schema
// (OpenAPI markers and CEL rules) must reject it with a cause on field whose
// message contains want, or accept it when want is empty.
//
// Every case is also given to policy.Compile, in the sample plane: the CRD is
// an earlier, additional gate, so it must never reject an object Compile
// accepts, and what it rejects Compile must reject too (or fail to decode).
type admissionCase struct {
	name  string
	kind  string
	spec  string // the object's spec, in YAML flow style
	field string // the field the API server blames
	want  string // a fragment of the API server's message; empty: accepted
}

const (
	wantSlidingRate = "a slidingWindow keeps one entry per request, so its rate must be 1 to 10000; use tokenBucket for larger limits"
	wantPeriod      = "period is out of range; use a duration from 1ms to 8784h (366 days), such as 500ms, 1s, 5m or 1h30m"
	wantMicros      = "period has sub-microsecond precision; round it to whole microseconds"
	wantBurstPeriod = "burst × period is too large to count exactly (burst × period in µs must be at most 2^53); shorten the period or lower the burst"
	wantGlobal      = "the global limit must be a tokenBucket: fairness and reconciliation work on its refill rate; remove algorithm or set it to tokenBucket"
	wantInterval    = "reconcileInterval is out of range; use a duration from 10ms to 1h (default 200ms)"
	wantFloors      = "tier floors add up to more than 100%; they must add up to at most 100% of the global limit: lower some floorPercent"
	wantDefaultTier = "defaultTier is not one of the tiers; name one of them or leave defaultTier unset"
	wantReplicas    = "minReplicas must not exceed maxReplicas; lower minReplicas or raise maxReplicas"
	wantTenant      = "tenant cannot be sent in X-Tenant; use 1 to 256 printable ASCII characters without spaces"
	wantKey         = "key cannot be sent in X-Api-Key; use 1 to 256 printable ASCII characters without spaces"
	wantCeiling     = "perTenantCeiling must be at most the pool size; lower perTenantCeiling or raise size"
	wantDuplicate   = "Duplicate value"
	wantTierName    = "should match '^[a-z0-9]([-a-z0-9]*[a-z0-9])?$'"
	wantEntryKey    = "a descriptor entry key may name only one of tenant, endpoint and apiKey; remove it from one list"
)

// plane is a valid QuotaPlane spec with extra fields appended.
func plane(extra string) string {
	return "{global: {rate: 1000}, tiers: [{name: gold, weight: 4}, {name: free}]" + extra + "}"
}

// limit is a valid EndpointQuota spec around one limit.
func limit(l string) string { return "{endpoint: probe, limit: " + l + "}" }

// manyTiers is a tier list of n distinct tiers, in YAML flow style.
func manyTiers(n int, asObjects bool) string {
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("t%d", i)
		if asObjects {
			names[i] = "{name: " + names[i] + "}"
		}
	}
	return "[" + strings.Join(names, ", ") + "]"
}

// tierOverrides is a list of n EndpointQuota tier overrides, in YAML flow style.
func tierOverrides(n int) string {
	overrides := make([]string, n)
	for i := range overrides {
		overrides[i] = fmt.Sprintf("{tier: t%d, limit: {rate: 1}}", i)
	}
	return "[" + strings.Join(overrides, ", ") + "]"
}

var admissionCases = []admissionCase{
	// Limit, the same schema wherever a limit appears.
	{name: "slidingWindow rate 0", kind: "EndpointQuota", spec: limit("{rate: 0, algorithm: slidingWindow}"), field: "spec.limit.rate", want: wantSlidingRate},
	{name: "slidingWindow rate above 10000", kind: "EndpointQuota", spec: limit("{rate: 10001, algorithm: slidingWindow}"), field: "spec.limit.rate", want: wantSlidingRate},
	{name: "slidingWindow rate in a tier's tenant limit", kind: "QuotaPlane", spec: "{global: {rate: 1000}, tiers: [{name: free, tenant: {rate: 20000, algorithm: slidingWindow}}]}", field: "spec.tiers[0].tenant.rate", want: wantSlidingRate},
	{name: "period zero", kind: "EndpointQuota", spec: limit("{rate: 1, period: 0s}"), field: "spec.limit.period", want: wantPeriod},
	{name: "period negative", kind: "EndpointQuota", spec: limit("{rate: 1, period: -1s}"), field: "spec.limit.period", want: wantPeriod},
	{name: "period below 1ms", kind: "EndpointQuota", spec: limit("{rate: 1, period: 999us}"), field: "spec.limit.period", want: wantPeriod},
	{name: "period above 366 days", kind: "EndpointQuota", spec: limit("{rate: 1, burst: 1, period: 8784h1us}"), field: "spec.limit.period", want: wantPeriod},
	{name: "period not a duration", kind: "EndpointQuota", spec: limit("{rate: 1, period: soon}"), field: "spec.limit.period", want: wantPeriod},
	{name: "period without a unit", kind: "EndpointQuota", spec: limit("{rate: 1, period: '60'}"), field: "spec.limit.period", want: wantPeriod},
	{name: "period of an api key's limit", kind: "TenantQuota", spec: "{tenant: t, keys: [{key: k, limit: {rate: 1, period: 0s}}]}", field: "spec.keys[0].limit.period", want: wantPeriod},
	{name: "period beyond what a duration holds", kind: "EndpointQuota", spec: limit("{rate: 1, period: 9999999h}"), field: "spec.limit.period", want: wantPeriod},
	{name: "period with nanoseconds", kind: "EndpointQuota", spec: limit("{rate: 1, period: 1.0000005s}"), field: "spec.limit.period", want: wantMicros},
	{name: "period with nanoseconds in another unit", kind: "EndpointQuota", spec: limit("{rate: 1, period: 1ms1ns}"), field: "spec.limit.period", want: wantMicros},
	// 2^53 / 8784h in µs = 284.8: burst 285 is one too many.
	{name: "burst × period above 2^53", kind: "EndpointQuota", spec: limit("{rate: 1, burst: 285, period: 8784h}"), field: "spec.limit", want: wantBurstPeriod},
	{name: "burst × period above 2^53 with the burst defaulted to rate", kind: "EndpointQuota", spec: limit("{rate: 285, period: 8784h}"), field: "spec.limit", want: wantBurstPeriod},
	{name: "burst × period above 2^53 in a slidingWindow, whose burst is its rate", kind: "EndpointQuota", spec: limit("{rate: 285, burst: 1, period: 8784h, algorithm: slidingWindow}"), field: "spec.limit", want: wantBurstPeriod},
	{name: "burst × period above 2^53 in a tenant's endpoint override", kind: "TenantQuota", spec: "{tenant: t, endpoints: [{endpoint: export, limit: {rate: 1, burst: 1000000000, period: 10s}}]}", field: "spec.endpoints[0].limit", want: wantBurstPeriod},
	{name: "burst negative", kind: "EndpointQuota", spec: limit("{rate: 1, burst: -1}"), field: "spec.limit.burst", want: "should be greater than or equal to 1"},
	{name: "rate above 10^9", kind: "EndpointQuota", spec: limit("{rate: 1000000001}"), field: "spec.limit.rate", want: "should be less than or equal to 1000000000"},
	{name: "algorithm unknown", kind: "EndpointQuota", spec: limit("{rate: 1, algorithm: leakyBucket}"), field: "spec.limit.algorithm", want: `supported values: "tokenBucket", "slidingWindow"`},

	// QuotaPlane.
	{name: "global slidingWindow", kind: "QuotaPlane", spec: "{global: {rate: 100, algorithm: slidingWindow}, tiers: [{name: free}]}", field: "spec.global.algorithm", want: wantGlobal},
	{name: "reconcileInterval below 10ms", kind: "QuotaPlane", spec: plane(", reconcileInterval: 9ms"), field: "spec.reconcileInterval", want: wantInterval},
	{name: "reconcileInterval above 1h", kind: "QuotaPlane", spec: plane(", reconcileInterval: 61m"), field: "spec.reconcileInterval", want: wantInterval},
	{name: "reconcileInterval not a duration", kind: "QuotaPlane", spec: plane(", reconcileInterval: often"), field: "spec.reconcileInterval", want: wantInterval},
	{name: "tier floors above 100", kind: "QuotaPlane", spec: "{global: {rate: 1000}, tiers: [{name: gold, floorPercent: 60}, {name: free, floorPercent: 41}]}", field: "spec.tiers", want: wantFloors},
	{name: "defaultTier not a tier", kind: "QuotaPlane", spec: plane(", defaultTier: silver"), field: "spec.defaultTier", want: wantDefaultTier},
	{name: "tier named twice", kind: "QuotaPlane", spec: "{global: {rate: 1000}, tiers: [{name: free}, {name: free, weight: 2}]}", field: "spec.tiers[1]", want: wantDuplicate},
	{name: "tier name not a DNS label", kind: "QuotaPlane", spec: "{global: {rate: 1000}, tiers: [{name: Free}]}", field: "spec.tiers[0].name", want: wantTierName},
	{name: "no tiers", kind: "QuotaPlane", spec: "{global: {rate: 1000}, tiers: []}", field: "spec.tiers", want: "should have at least 1 items"},
	{name: "17 tiers", kind: "QuotaPlane", spec: "{global: {rate: 1000}, tiers: " + manyTiers(17, true) + "}", field: "spec.tiers", want: "must have at most 16 items"},
	{name: "floorPercent above 100", kind: "QuotaPlane", spec: "{global: {rate: 1000}, tiers: [{name: free, floorPercent: 101}]}", field: "spec.tiers[0].floorPercent", want: "should be less than or equal to 100"},
	{name: "minReplicas above maxReplicas", kind: "QuotaPlane", spec: plane(", enforcer: {minReplicas: 5, maxReplicas: 2}"), field: "spec.enforcer", want: wantReplicas},
	{name: "mode unknown", kind: "QuotaPlane", spec: plane(", mode: global"), field: "spec.mode", want: `supported values: "local", "central", "local-reconciled"`},

	// TenantQuota. That its tier, endpoints and shards fit the plane is
	// checked across objects, by Compile only.
	{name: "tenant with a space", kind: "TenantQuota", spec: "{tenant: acme corp}", field: "spec.tenant", want: wantTenant},
	{name: "tenant not ASCII", kind: "TenantQuota", spec: "{tenant: äcme}", field: "spec.tenant", want: wantTenant},
	{name: "tenant longer than 256", kind: "TenantQuota", spec: "{tenant: " + strings.Repeat("a", 257) + "}", field: "spec.tenant", want: "may not be more than 256 bytes"},
	{name: "api key with a tab", kind: "TenantQuota", spec: "{tenant: acme, keys: [{key: \"k\\t1\", limit: {rate: 1}}]}", field: "spec.keys[0].key", want: wantKey},
	{name: "api key listed twice", kind: "TenantQuota", spec: "{tenant: acme, keys: [{key: k, limit: {rate: 1}}, {key: k, limit: {rate: 2}}]}", field: "spec.keys[1]", want: wantDuplicate},
	{name: "endpoint listed twice", kind: "TenantQuota", spec: "{tenant: acme, endpoints: [{endpoint: read, limit: {rate: 1}}, {endpoint: read, limit: {rate: 2}}]}", field: "spec.endpoints[1]", want: wantDuplicate},
	{name: "endpoint override not an endpoint name", kind: "TenantQuota", spec: "{tenant: acme, endpoints: [{endpoint: a/b, limit: {rate: 1}}]}", field: "spec.endpoints[0].endpoint", want: "should match"},
	{name: "tier not a tier name", kind: "TenantQuota", spec: "{tenant: acme, tier: Gold}", field: "spec.tier", want: wantTierName},
	{name: "weight above 10^6", kind: "TenantQuota", spec: "{tenant: acme, weight: 1000001}", field: "spec.weight", want: "should be less than or equal to 1000000"},

	// EndpointQuota.
	{name: "endpoint with a slash", kind: "EndpointQuota", spec: "{endpoint: a/b}", field: "spec.endpoint", want: "should match"},
	{name: "cost above 10^6", kind: "EndpointQuota", spec: "{endpoint: probe, cost: 1000001}", field: "spec.cost", want: "should be less than or equal to 1000000"},
	{name: "tier override listed twice", kind: "EndpointQuota", spec: "{endpoint: probe, tiers: [{tier: free, limit: {rate: 1}}, {tier: free, limit: {rate: 2}}]}", field: "spec.tiers[1]", want: wantDuplicate},
	{name: "17 tier overrides", kind: "EndpointQuota", spec: "{endpoint: probe, tiers: " + tierOverrides(17) + "}", field: "spec.tiers", want: "must have at most 16 items"},

	// BurstPool.
	{name: "perTenantCeiling above size", kind: "BurstPool", spec: "{size: 100, refillRate: 10, perTenantCeiling: 101}", field: "spec.perTenantCeiling", want: wantCeiling},
	{name: "17 borrowing tiers", kind: "BurstPool", spec: "{size: 100, refillRate: 10, perTenantCeiling: 10, tiers: " + manyTiers(17, false) + "}", field: "spec.tiers", want: "must have at most 16 items"},
	{name: "borrowing tier not a tier name", kind: "BurstPool", spec: "{size: 100, refillRate: 10, perTenantCeiling: 10, tiers: [Gold]}", field: "spec.tiers[0]", want: wantTierName},
	{name: "keyBinding unknown", kind: "QuotaPlane", spec: plane(", keyBinding: closed"), field: "spec.keyBinding", want: `supported values: "open", "bound"`},
	{name: "descriptor entry key naming tenant and endpoint", kind: "QuotaPlane", spec: plane(", descriptors: {tenant: [x, tenant], endpoint: [x]}"), field: "spec.descriptors", want: wantEntryKey},
	{name: "descriptor entry key naming tenant and api key", kind: "QuotaPlane", spec: plane(", descriptors: {tenant: [x], apiKey: [x]}"), field: "spec.descriptors", want: wantEntryKey},
	{name: "descriptor entry key naming endpoint and api key", kind: "QuotaPlane", spec: plane(", descriptors: {endpoint: [x], apiKey: [x]}"), field: "spec.descriptors", want: wantEntryKey},
	{name: "descriptor entry key with a space", kind: "QuotaPlane", spec: plane(", descriptors: {tenant: ['x y']}"), field: "spec.descriptors.tenant[0]", want: "should match"},
	{name: "9 descriptor entry keys", kind: "QuotaPlane", spec: plane(", descriptors: {tenant: [a, b, c, d, e, f, g, h, i]}"), field: "spec.descriptors.tenant", want: "must have at most 8 items"},
	{name: "match Pattern without a star", kind: "EndpointQuota", spec: "{endpoint: probe, match: [{path: {type: Pattern, value: /v1/x}}]}", field: "spec.match[0].path", want: "a Pattern needs at least one segment that is exactly '*'"},
	{name: "match path relative", kind: "EndpointQuota", spec: "{endpoint: probe, match: [{path: {value: v1/x}}]}", field: "spec.match[0].path.value", want: "should match"},
	{name: "match path with an empty segment", kind: "EndpointQuota", spec: "{endpoint: probe, match: [{path: {value: /v1//x}}]}", field: "spec.match[0].path.value", want: "should match"},
	{name: "match method unknown", kind: "EndpointQuota", spec: "{endpoint: probe, match: [{path: {value: /v1}, methods: [FETCH]}]}", field: "spec.match[0].methods[0]", want: "supported values"},
	{name: "match type unknown", kind: "EndpointQuota", spec: "{endpoint: probe, match: [{path: {type: Regex, value: /v1}}]}", field: "spec.match[0].path.type", want: "supported values"},
	{name: "key hash too short", kind: "TenantQuota", spec: "{tenant: acme, keyHashes: ['sha256:abc']}", field: "spec.keyHashes[0]", want: "should match"},
	{name: "key hash listed twice", kind: "TenantQuota", spec: "{tenant: acme, keyHashes: [" + keyHash + ", " + keyHash + "]}", field: "spec.keyHashes[1]", want: wantDuplicate},

	// Accepted: the edges of every rule above, and what Compile allows that
	// a stricter schema might forbid.
	{name: "tokenBucket burst below rate", kind: "EndpointQuota", spec: limit("{rate: 1000, burst: 10}")},
	{name: "no refill", kind: "EndpointQuota", spec: limit("{rate: 0, burst: 50}")},
	{name: "period 1ms", kind: "EndpointQuota", spec: limit("{rate: 1, period: 1ms}")},
	{name: "period 1500µs", kind: "EndpointQuota", spec: limit("{rate: 1, period: 1500µs}")},
	{name: "period 1.5s", kind: "EndpointQuota", spec: limit("{rate: 1, period: 1.5s}")},
	{name: "period as Go prints it", kind: "EndpointQuota", spec: limit("{rate: 1, period: 1h30m0s}")},
	{name: "burst × period just under 2^53, period 366 days", kind: "EndpointQuota", spec: limit("{rate: 1, burst: 284, period: 8784h}")},
	{name: "burst 10^9 with period 9s", kind: "EndpointQuota", spec: limit("{rate: 1, burst: 1000000000, period: 9s}")},
	{name: "slidingWindow rate 10000, burst ignored", kind: "EndpointQuota", spec: limit("{rate: 10000, burst: 1000000000, period: 1s, algorithm: slidingWindow}")},
	{name: "slidingWindow 2 per 5 minutes", kind: "EndpointQuota", spec: limit("{rate: 2, period: 300s, algorithm: slidingWindow}")},
	{name: "tier overrides", kind: "EndpointQuota", spec: "{endpoint: probe, tiers: [{tier: enterprise, limit: {rate: 1}}, {tier: free, limit: {rate: 1}}]}"},
	{name: "global tokenBucket named", kind: "QuotaPlane", spec: "{global: {rate: 100, algorithm: tokenBucket}, tiers: [{name: free}]}"},
	{name: "tier floors exactly 100", kind: "QuotaPlane", spec: "{global: {rate: 1000}, tiers: [{name: gold, floorPercent: 60}, {name: free, floorPercent: 40}]}"},
	{name: "16 tiers", kind: "QuotaPlane", spec: "{global: {rate: 1000}, tiers: " + manyTiers(16, true) + "}"},
	{name: "defaultTier one of the tiers", kind: "QuotaPlane", spec: plane(", defaultTier: gold")},
	{name: "reconcileInterval 10ms", kind: "QuotaPlane", spec: plane(", reconcileInterval: 10ms")},
	{name: "reconcileInterval 1h", kind: "QuotaPlane", spec: plane(", reconcileInterval: 1h0m0s")},
	{name: "minReplicas equal to maxReplicas", kind: "QuotaPlane", spec: plane(", enforcer: {minReplicas: 3, maxReplicas: 3}")},
	{name: "minReplicas above the default maxReplicas", kind: "QuotaPlane", spec: plane(", enforcer: {minReplicas: 20}")},
	{name: "minReplicas 0", kind: "QuotaPlane", spec: plane(", enforcer: {minReplicas: 0, maxReplicas: 1}")},
	{name: "tenant id with punctuation", kind: "TenantQuota", spec: "{tenant: 'acme:eu-1/prod~#1', tier: standard}"},
	{name: "tenant without a tier", kind: "TenantQuota", spec: "{tenant: acme, keys: [{key: 'k=1;x', limit: {rate: 1}}]}"},
	{name: "tenant id of 256 characters", kind: "TenantQuota", spec: "{tenant: " + strings.Repeat("a", 256) + "}"},
	{name: "perTenantCeiling equal to size", kind: "BurstPool", spec: "{size: 100, refillRate: 0, perTenantCeiling: 100}"},
	{name: "keys bound and descriptors mapped", kind: "QuotaPlane", spec: plane(", keyBinding: bound, descriptors: {tenant: [x-tenant, tenant], endpoint: [generic_key], apiKey: ['key:1']}")},
	{name: "matches of every type", kind: "EndpointQuota", spec: "{endpoint: probe, match: [{path: {type: Exact, value: /v1/probe}, methods: [GET, HEAD]}, {path: {type: Pattern, value: '/v1/models/*/probe/'}}, {path: {value: /}}]}"},
	{name: "key hashes", kind: "TenantQuota", spec: "{tenant: acme, keyHashes: [" + keyHash + "]}"},
}

// keyHash is a valid api key hash (of "k").
const keyHash = "'sha256:8254c329a92850f6d539dd376f4816ee2764517da5e0235514af433164480d7a'"

// TestCRDValidation runs every admissionCase, and the sample plane, against
// one real API server with the generated CRDs.
func TestCRDValidation(t *testing.T) {
	env := testenv.Start(t)
	samples, err := policy.ReadDir(filepath.Join(testenv.Root(), "config", "samples"))
	if err != nil {
		t.Fatalf("read the samples: %v", err)
	}

	t.Run("samples are accepted", func(t *testing.T) {
		// The documents as written, as kubectl apply -f config/samples sends
		// them, not as the Go types would re-encode them.
		ns := namespace(t, env.Client, "samples")
		docs := sampleDocuments(t)
		if len(docs) != len(samples) {
			t.Fatalf("config/samples holds %d documents but %d quota objects", len(docs), len(samples))
		}
		for _, doc := range docs {
			obj := unstructuredObject(t, doc)
			obj.SetNamespace(ns)
			if err := env.Client.Create(t.Context(), obj); err != nil {
				t.Errorf("create sample %s %s: %v", obj.GetKind(), obj.GetName(), err)
			}
		}
	})

	ns := namespace(t, env.Client, "cases")
	seen := map[string]bool{}
	for i, c := range admissionCases {
		if seen[c.name] {
			t.Fatalf("two cases are named %q", c.name)
		}
		seen[c.name] = true
		name := fmt.Sprintf("case-%02d", i)
		doc := fmt.Sprintf("apiVersion: quotaplane.io/v1alpha1\nkind: %s\nmetadata:\n  name: %s\nspec: %s\n", c.kind, name, c.spec)
		t.Run(c.name, func(t *testing.T) {
			checkAdmission(t, env.Client, ns, doc, c)
			checkCompile(t, samples, doc, c)
		})
	}
}

// checkAdmission creates doc in namespace ns and checks the API server's answer.
func checkAdmission(t *testing.T, c client.Client, ns, doc string, tc admissionCase) {
	t.Helper()
	obj := unstructuredObject(t, []byte(doc))
	obj.SetNamespace(ns)
	err := c.Create(t.Context(), obj)
	if tc.want == "" {
		if err != nil {
			t.Fatalf("the API server rejected a valid %s: %v\n%s", tc.kind, err, doc)
		}
		return
	}
	if err == nil {
		t.Fatalf("the API server accepted a %s it must reject with %q on %s\n%s", tc.kind, tc.want, tc.field, doc)
	}
	var status apierrors.APIStatus
	if !apierrors.IsInvalid(err) || !errors.As(err, &status) || status.Status().Details == nil {
		t.Fatalf("want a field error (422 Invalid), got %v", err)
	}
	for _, cause := range status.Status().Details.Causes {
		if cause.Field == tc.field && strings.Contains(cause.Message, tc.want) {
			t.Logf("rejected: %s: %s", cause.Field, cause.Message)
			return
		}
	}
	t.Fatalf("no cause on %s with %q in: %v", tc.field, tc.want, err)
}

// checkCompile compiles doc's object in the sample plane: Compile must report
// it exactly when the API server rejects it (a document that does not decode
// counts as reported, as it does for LoadDir).
func checkCompile(t *testing.T, samples []runtime.Object, doc string, tc admissionCase) {
	t.Helper()
	decoded, err := policy.DecodeYAML([]byte(doc))
	if err != nil {
		if tc.want == "" {
			t.Fatalf("policy.DecodeYAML rejected a valid %s: %v\n%s", tc.kind, err, doc)
		}
		return
	}
	obj := decoded[0].(metav1.Object)
	// The sample plane and endpoints give tiers and endpoints to refer to;
	// a QuotaPlane case replaces the sample plane.
	objs := []runtime.Object{decoded[0]}
	for _, s := range samples {
		switch s.(type) {
		case *v1alpha1.QuotaPlane:
			if tc.kind != "QuotaPlane" {
				objs = append(objs, s)
			}
		case *v1alpha1.EndpointQuota:
			objs = append(objs, s)
		}
	}
	_, problems := policy.Compile(objs)
	var own []string
	for _, p := range problems {
		if p.Kind == tc.kind && p.Name == obj.GetName() {
			own = append(own, p.String())
		}
	}
	switch {
	case tc.want == "" && len(own) > 0:
		t.Fatalf("Compile rejects what the API server accepts:\n%s", strings.Join(own, "\n"))
	case tc.want != "" && len(own) == 0:
		t.Fatalf("the API server rejects (%s) what Compile accepts: the schema must forbid only what Compile forbids", tc.want)
	}
}

// unstructuredObject decodes one YAML document as the API server will see
// it: integers stay integers, and fields the Go types would drop or reject
// (an explicit zero, a period that does not parse) are kept.
func unstructuredObject(t *testing.T, doc []byte) *unstructured.Unstructured {
	t.Helper()
	data, err := utilyaml.ToJSON(doc)
	if err != nil {
		t.Fatalf("YAML: %v\n%s", err, doc)
	}
	obj := &unstructured.Unstructured{}
	if err := obj.UnmarshalJSON(data); err != nil {
		t.Fatalf("object: %v\n%s", err, doc)
	}
	return obj
}

// sampleDocuments reads the YAML documents of config/samples, skipping
// those that hold only comments.
func sampleDocuments(t *testing.T) [][]byte {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(testenv.Root(), "config", "samples", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no YAML files in config/samples (%v)", err)
	}
	var docs [][]byte
	for _, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		reader := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
		for {
			doc, err := reader.Read()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatalf("%s: %v", file, err)
			}
			if data, err := utilyaml.ToJSON(doc); err == nil && string(bytes.TrimSpace(data)) == "null" {
				continue
			}
			docs = append(docs, doc)
		}
	}
	return docs
}

// namespace creates a namespace for one part of the test and returns its name.
func namespace(t *testing.T, c client.Client, name string) string {
	t.Helper()
	ns := &unstructured.Unstructured{}
	ns.SetAPIVersion("v1")
	ns.SetKind("Namespace")
	ns.SetName(name)
	if err := c.Create(t.Context(), ns); err != nil {
		t.Fatalf("create namespace %s: %v", name, err)
	}
	return name
}
