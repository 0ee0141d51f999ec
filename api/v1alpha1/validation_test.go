package v1alpha1_test

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
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
	wantSlidingRate  = "a slidingWindow keeps one entry per request, so its rate must be 1 to 10000; use tokenBucket for larger limits"
	wantPeriod       = "period is out of range; use a duration from 1ms to 8784h (366 days), such as 500ms, 1s, 5m or 1h30m"
	wantMicros       = "period has sub-microsecond precision; round it to whole microseconds"
	wantBurstPeriod  = "burst × period is too large to count exactly (burst × period in µs must be at most 2^53); shorten the period or lower the burst"
	wantGlobal       = "the global limit must be a tokenBucket: fairness and reconciliation work on its refill rate; remove algorithm or set it to tokenBucket"
	wantInterval     = "reconcileInterval is out of range; use a duration from 10ms to 1h (default 200ms)"
	wantFloors       = "tier floors add up to more than 100%; they must add up to at most 100% of the global limit: lower some floorPercent"
	wantDefaultTier  = "defaultTier is not one of the tiers; name one of them or leave defaultTier unset"
	wantReplicas     = "minReplicas must not exceed maxReplicas; lower minReplicas or raise maxReplicas"
	wantTenant       = "tenant cannot be sent in X-Tenant; use 1 to 256 printable ASCII characters without spaces"
	wantKey          = "key cannot be sent in X-Api-Key; use 1 to 256 printable ASCII characters without spaces"
	wantCeiling      = "perTenantCeiling must be at most the pool size; lower perTenantCeiling or raise size"
	wantDuplicate    = "Duplicate value"
	wantTierName     = "should match '^[a-z0-9]([-a-z0-9]*[a-z0-9])?$'"
	wantEntryKey     = "a descriptor entry key may name only one of tenant, endpoint and apiKey; remove it from one list"
	wantTimeout      = "timeout must be shorter than interval (defaults 5s and 15s): a probe ends before the next starts; shorten timeout or lengthen interval"
	wantProbeURL     = "url must be an absolute http or https URL with a host, such as https://api.example.com/v1/models"
	wantWebhookURL   = "url must be an absolute https or http URL with a host, such as https://hooks.example.com/quotaplane"
	wantBody         = "a body is sent only with method POST; set method: POST or remove body"
	wantSignal       = "an upstream with sensing Enabled needs a signal: add a probe, set passive: true, or set sensing: Disabled"
	wantHeaderTwice  = "a header is named twice (names are compared without case); keep one"
	wantHeaderValue  = "a header takes its value from value or from secretKeyRef, not both; remove one"
	wantUpstreamName = "an Upstream's name must be a DNS label (lower-case letters, digits and '-', at most 63): rename it"
)

// upstream is a valid Upstream spec on the sample endpoint export with extra
// fields appended.
func upstream(extra string) string {
	return "{capacity: {rate: 600, period: 1m}, endpoints: [export]" + extra + "}"
}

// probe is a valid Upstream spec with a probe of extra fields besides its url.
func probe(extra string) string {
	return upstream(", probe: {url: 'https://api.example.com/v1/models'" + extra + "}")
}

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
	{name: "maxReplicas above 1000", kind: "QuotaPlane", spec: plane(", enforcer: {maxReplicas: 5000}"), field: "spec.enforcer.maxReplicas", want: "should be less than or equal to 1000"},
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

	// Upstream (seed 004) and the priority signals. That an Upstream's
	// endpoints are the plane's, and that it is one of at most 16, is
	// checked across objects, by Compile only.
	{name: "probe timeout equal to interval", kind: "Upstream", spec: probe(", interval: 5s, timeout: 5s"), field: "spec.probe.timeout", want: wantTimeout},
	{name: "probe timeout above interval", kind: "Upstream", spec: probe(", interval: 10s, timeout: 1m"), field: "spec.probe.timeout", want: wantTimeout},
	{name: "probe default timeout above a short interval", kind: "Upstream", spec: probe(", interval: 2s"), field: "spec.probe.timeout", want: wantTimeout},
	{name: "probe url without a scheme", kind: "Upstream", spec: upstream(", probe: {url: api.example.com/v1/models}"), field: "spec.probe.url", want: wantProbeURL},
	{name: "probe url of another scheme", kind: "Upstream", spec: upstream(", probe: {url: 'ftp://api.example.com/models'}"), field: "spec.probe.url", want: wantProbeURL},
	{name: "probe url without a host", kind: "Upstream", spec: upstream(", probe: {url: 'https:///v1/models'}"), field: "spec.probe.url", want: wantProbeURL},
	{name: "probe interval below 1s", kind: "Upstream", spec: probe(", interval: 500ms, timeout: 100ms"), field: "spec.probe.interval", want: "interval is out of range; use a duration from 1s to 10m (default 15s)"},
	{name: "probe body with GET", kind: "Upstream", spec: probe(", body: '{}'"), field: "spec.probe.body", want: wantBody},
	{name: "probe method unknown", kind: "Upstream", spec: probe(", method: PUT"), field: "spec.probe.method", want: `supported values: "GET", "POST", "HEAD"`},
	{name: "probe header named twice without case", kind: "Upstream", spec: probe(", headers: [{name: X-Key, value: a}, {name: x-key, value: b}]"), field: "spec.probe.headers", want: wantHeaderTwice},
	{name: "probe header with a value and a Secret", kind: "Upstream", spec: probe(", headers: [{name: X-Key, value: a, secretKeyRef: {name: s, key: k}}]"), field: "spec.probe.headers[0]", want: wantHeaderValue},
	{name: "probe header value with a newline", kind: "Upstream", spec: probe(", headers: [{name: X-Key, value: \"a\\r\\nHost: evil\"}]"), field: "spec.probe.headers[0].value", want: "should match"},
	{name: "probe expected status 600", kind: "Upstream", spec: probe(", expectedStatuses: [200, 600]"), field: "spec.probe.expectedStatuses[1]", want: "should be less than or equal to 599"},
	{name: "upstream endpoint listed twice", kind: "Upstream", spec: "{capacity: {rate: 600}, endpoints: [export, read, export]}", field: "spec.endpoints[2]", want: wantDuplicate},
	{name: "upstream without endpoints", kind: "Upstream", spec: "{capacity: {rate: 600}, endpoints: []}", field: "spec.endpoints", want: "should have at least 1 items"},
	{name: "upstream endpoint not an endpoint name", kind: "Upstream", spec: "{capacity: {rate: 600}, endpoints: [a/b]}", field: "spec.endpoints[0]", want: "should match"},
	{name: "upstream capacity rate 0", kind: "Upstream", spec: "{capacity: {rate: 0}, endpoints: [export]}", field: "spec.capacity.rate", want: "should be greater than or equal to 1"},
	{name: "upstream capacity period above 24h", kind: "Upstream", spec: "{capacity: {rate: 1, period: 25h}, endpoints: [export]}", field: "spec.capacity.period", want: "period is out of range; use a duration from 1s to 24h"},
	{name: "upstream window below 1m", kind: "Upstream", spec: upstream(", window: 30s"), field: "spec.window", want: "window is out of range; use a duration from 1m to 1h (default 5m)"},
	{name: "upstream latencyCeiling above 10m", kind: "Upstream", spec: upstream(", latencyCeiling: 11m"), field: "spec.latencyCeiling", want: "latencyCeiling is out of range"},
	{name: "upstream without a signal", kind: "Upstream", spec: upstream(", passive: false"), field: "spec", want: wantSignal},
	{name: "upstream sensing On", kind: "Upstream", spec: upstream(", sensing: 'On'"), field: "spec.sensing", want: `supported values: "Enabled", "Disabled"`},
	{name: "upstream quotaSignal unknown", kind: "Upstream", spec: upstream(", quotaSignal: Used"), field: "spec.quotaSignal", want: `supported values: "Remaining", "Limit"`},
	{name: "importance 101", kind: "TenantQuota", spec: "{tenant: acme, priority: {importance: 101}}", field: "spec.priority.importance", want: "should be less than or equal to 100"},
	{name: "contractValue negative", kind: "TenantQuota", spec: "{tenant: acme, priority: {contractValue: -1}}", field: "spec.priority.contractValue", want: "should be greater than or equal to 0"},
	{name: "priorityBase 101", kind: "QuotaPlane", spec: "{global: {rate: 1000}, tiers: [{name: gold, priorityBase: 101}]}", field: "spec.tiers[0].priorityBase", want: "should be less than or equal to 100"},
	{name: "outage webhook url without a scheme", kind: "QuotaPlane", spec: plane(", outage: {webhook: {url: hooks.example.com}}"), field: "spec.outage.webhook.url", want: wantWebhookURL},
	{name: "outage webhook secret key with a slash", kind: "QuotaPlane", spec: plane(", outage: {webhook: {url: 'https://hooks.example.com', secretRef: {name: hooks, key: a/b}}}"), field: "spec.outage.webhook.secretRef.key", want: "should match"},

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
	{name: "upstream with the defaults", kind: "Upstream", spec: "{capacity: {rate: 600}, endpoints: [export]}"},
	{name: "upstream with every field", kind: "Upstream", spec: upstream(", passive: true, window: 1h, latencyCeiling: 10ms, quotaSignal: Limit, sensing: Enabled, probe: {" +
		"url: 'http://10.0.0.7:8080/v1/models?probe=1', method: POST, body: '{\"model\": \"m\"}', interval: 10m, timeout: 9m59s, expectedStatuses: [200, 204, 429], " +
		"headers: [{name: Authorization, secretKeyRef: {name: llm, key: token}}, {name: X-Probe, value: \"1\\t2\"}, {name: X-Empty}], " +
		"rateLimitHeaders: {remaining: x-left, limit: x-limit, ietf: true}}")},
	{name: "upstream probe interval 1s with timeout just under", kind: "Upstream", spec: probe(", interval: 1s, timeout: 999ms")},
	{name: "upstream sensing Disabled without a signal", kind: "Upstream", spec: upstream(", passive: false, sensing: Disabled")},
	{name: "upstream on three endpoints, capacity per day", kind: "Upstream", spec: "{capacity: {rate: 1000000000, period: 24h}, endpoints: [export, read, write]}"},
	{name: "priority signals", kind: "TenantQuota", spec: "{tenant: acme, priority: {contractValue: 1000000000000, realtime: true, importance: 100}}"},
	{name: "priority signals at zero", kind: "TenantQuota", spec: "{tenant: acme, priority: {contractValue: 0, realtime: false, importance: 0}}"},
	{name: "priorityBase 0 and 100", kind: "QuotaPlane", spec: "{global: {rate: 1000}, tiers: [{name: gold, weight: 2, priorityBase: 100}, {name: free, priorityBase: 0}]}"},
	{name: "outage webhook", kind: "QuotaPlane", spec: plane(", outage: {webhook: {url: 'https://hooks.example.com/quotaplane', secretRef: {name: hooks, key: hmac.key}}}")},
	{name: "outage webhook over http, unsigned", kind: "QuotaPlane", spec: plane(", outage: {webhook: {url: 'http://notifier.quota.svc:8080/'}}")},
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

	t.Run("the sample upstream is accepted", func(t *testing.T) {
		// config/samples/upstream, beside the sample plane until the manager
		// reconciles Upstreams.
		dir := filepath.Join(testenv.Root(), "config", "samples", "upstream")
		ups, err := policy.ReadDir(dir)
		if err != nil || len(ups) == 0 {
			t.Fatalf("read %s: %d objects, %v", dir, len(ups), err)
		}
		ns := namespace(t, env.Client, "samples-upstream")
		for _, doc := range sampleDocumentsIn(t, dir) {
			obj := unstructuredObject(t, doc)
			obj.SetNamespace(ns)
			if err := env.Client.Create(t.Context(), obj); err != nil {
				t.Errorf("create sample %s %s: %v", obj.GetKind(), obj.GetName(), err)
			}
		}
		if _, problems := policy.Compile(append(slices.Clone(samples), ups...)); len(problems) > 0 {
			t.Errorf("the samples with %s do not compile: %v", dir, problems)
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

	// An Upstream's name is the plan's, the metrics' and X-Quota-Reason's:
	// a DNS label, which a DNS subdomain (what the API server allows any
	// name) need not be.
	for name, want := range map[string]string{"llm.v1": wantUpstreamName, strings.Repeat("u", 64): wantUpstreamName, "llm-v1": ""} {
		t.Run("upstream named "+name, func(t *testing.T) {
			c := admissionCase{name: "upstream named " + name, kind: "Upstream", spec: upstream(""), field: "<nil>", want: want}
			doc := fmt.Sprintf("apiVersion: quotaplane.io/v1alpha1\nkind: Upstream\nmetadata:\n  name: %s\nspec: %s\n", name, c.spec)
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
	return sampleDocumentsIn(t, filepath.Join(testenv.Root(), "config", "samples"))
}

// sampleDocumentsIn reads the YAML documents of the *.yaml files in dir,
// skipping those that hold only comments.
func sampleDocumentsIn(t *testing.T, dir string) [][]byte {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no YAML files in %s (%v)", dir, err)
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
