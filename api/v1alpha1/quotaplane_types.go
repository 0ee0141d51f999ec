package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Mode selects where decisions are made.
// +kubebuilder:validation:Enum=local;central;local-reconciled
type Mode string

const (
	// ModeLocal decides in the enforcer's process only: every limit holds
	// per enforcer, so N replicas admit up to N times it (the manager keeps a
	// local plane at one replica).
	ModeLocal Mode = "local"
	// ModeCentral decides every request in Redis with one atomic script:
	// every level exact fleet-wide, under any routing; fairness and floors
	// fleet-wide.
	ModeCentral Mode = "central"
	// ModeLocalReconciled decides locally on the node's part of each limit,
	// which follows where that limit's demand arrives, and reconciles with
	// Redis every reconcileInterval: every level within a few percent of its
	// limit under any routing (within 5% at 200ms, measured); limits too small
	// to split over the nodes are decided in Redis.
	ModeLocalReconciled Mode = "local-reconciled"
)

// Fairness selects how contended global capacity is shared.
// +kubebuilder:validation:Enum=none;maxmin;wfq;drr
type Fairness string

const (
	// FairnessNone is first come, first served. Tier floors then act only as
	// priority reserves: a tier's floor share of the global burst is kept
	// from lower tiers, which is not a rate guarantee.
	FairnessNone Fairness = "none"
	// FairnessMaxMin is weighted max-min water-filling over measured demand,
	// fleet-wide in every mode: a tenant above its share is paced to it while
	// the global level is contended.
	FairnessMaxMin Fairness = "maxmin"
	// FairnessWFQ paces as maxmin and, in addition, holds a request denied
	// at the contended global level up to 50ms in a bounded queue that admits
	// in weighted-fair-queueing (virtual finish time) order.
	FairnessWFQ Fairness = "wfq"
	// FairnessDRR paces as maxmin and queues as wfq, admitting in deficit
	// round robin order.
	FairnessDRR Fairness = "drr"
)

// ShareBy selects whose weight contended global capacity is shared by.
// +kubebuilder:validation:Enum=tenant;tier
type ShareBy string

const (
	// ShareByTenant is seed 002's weighted max-min fairness across tenants:
	// every tenant is a flow whose weight is its tier's weight (or its own
	// override), so a tier with 4,000 tenants gets more than a tier of 40
	// of the same weight. Tier floors still hold.
	ShareByTenant ShareBy = "tenant"
	// ShareByTier shares among tiers by the tiers' weights first, then
	// splits each tier's share among its tenants by theirs: a tier's total
	// does not grow with its number of tenants.
	ShareByTier ShareBy = "tier"
)

// FailureMode says what an enforcer does when its shared state (Redis) is unreachable.
// +kubebuilder:validation:Enum=degrade;allow;deny
type FailureMode string

const (
	// FailureDegrade enforces locally with this node's share of every limit
	// (central: debited from the fleet's buckets when Redis is back;
	// local-reconciled: the parts the last reconcile sized).
	FailureDegrade FailureMode = "degrade"
	// FailureAllow admits everything while Redis is unreachable.
	FailureAllow FailureMode = "allow"
	// FailureDeny denies everything while Redis is unreachable.
	FailureDeny FailureMode = "deny"
)

// UnknownPolicy says what happens to a tenant or endpoint the plane does not name.
// +kubebuilder:validation:Enum=default;deny
type UnknownPolicy string

const (
	// UnknownDefault treats the unknown name with the defaults (default tier, cost 1).
	UnknownDefault UnknownPolicy = "default"
	// UnknownDeny denies requests for unknown names.
	UnknownDeny UnknownPolicy = "deny"
)

// KeyBinding says whether an api key must belong to the tenant a request names.
// +kubebuilder:validation:Enum=open;bound
type KeyBinding string

const (
	// KeyBindingOpen lets a request name any tenant with any api key: the
	// caller (a gateway that authenticated it) is trusted to say both.
	KeyBindingOpen KeyBinding = "open"
	// KeyBindingBound refuses a request whose api key is not one of its
	// tenant's keys (TenantQuota spec.keyHashes or spec.keySecretRef); it is
	// charged to no one.
	KeyBindingBound KeyBinding = "bound"
)

// DescriptorMapping says which entries of an Envoy rate limit descriptor
// name a request's tenant, endpoint and api key. Envoy builds descriptors
// from route actions: request_headers (the entry key is the action's
// descriptor_key), generic_key (key "generic_key" unless descriptor_key is
// set), header_value_match (key "header_match" unless descriptor_key is set).
// Each list is tried in order; the first key present in a descriptor wins;
// entries whose keys no list names are ignored. A key may appear in one list only.
// +kubebuilder:validation:XValidation:rule="!has(self.tenant) || !has(self.endpoint) || !self.tenant.exists(k, k in self.endpoint)",message="a descriptor entry key may name only one of tenant, endpoint and apiKey; remove it from one list"
// +kubebuilder:validation:XValidation:rule="!has(self.tenant) || !has(self.apiKey) || !self.tenant.exists(k, k in self.apiKey)",message="a descriptor entry key may name only one of tenant, endpoint and apiKey; remove it from one list"
// +kubebuilder:validation:XValidation:rule="!has(self.endpoint) || !has(self.apiKey) || !self.endpoint.exists(k, k in self.apiKey)",message="a descriptor entry key may name only one of tenant, endpoint and apiKey; remove it from one list"
type DescriptorMapping struct {
	// tenant lists the entry keys whose value is the tenant id. Default [tenant].
	// A descriptor with none of them is refused (InvalidArgument).
	// +optional
	// +listType=set
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=8
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=64
	// +kubebuilder:validation:items:Pattern=`^[A-Za-z0-9._:-]+$`
	Tenant []string `json:"tenant,omitempty"`

	// endpoint lists the entry keys whose value is the endpoint name. Default
	// [endpoint]. A descriptor with none of them is decided as a request for
	// no named endpoint: cost 1 and no endpoint limit (unknownEndpoints:
	// default), or refused (unknownEndpoints: deny).
	// +optional
	// +listType=set
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=8
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=64
	// +kubebuilder:validation:items:Pattern=`^[A-Za-z0-9._:-]+$`
	Endpoint []string `json:"endpoint,omitempty"`

	// apiKey lists the entry keys whose value is the api key. Default
	// [api_key]. A descriptor with none of them skips the key level (and is
	// refused when keyBinding is bound).
	// +optional
	// +listType=set
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=8
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=64
	// +kubebuilder:validation:items:Pattern=`^[A-Za-z0-9._:-]+$`
	APIKey []string `json:"apiKey,omitempty"`
}

// Tier is a class of tenants with default limits, a fairness weight and a floor.
type Tier struct {
	// name identifies the tier, for example enterprise, standard or free.
	// +required
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	// +kubebuilder:validation:MaxLength=63
	Name string `json:"name"`

	// weight is the tier's share of contended global capacity relative to other
	// tiers: among tiers that want more than their share, one with a lower
	// weight is cut more. It also orders the tiers (for reserves with
	// fairness none). Default 1.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000000
	Weight int64 `json:"weight,omitempty"`

	// floorPercent is the percentage of the global rate the tier keeps under
	// global pressure, as far as its tenants want it (fairness maxmin, wfq or
	// drr; fleet-wide in every mode); with fairness none, the percentage of
	// the global burst that lower tiers cannot take. Floors of all tiers add
	// up to at most 100.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100
	FloorPercent int64 `json:"floorPercent,omitempty"`

	// tenant is the default per-tenant limit of the tier's tenants. Unset means
	// tenants of the tier are bounded only by the global limit.
	// +optional
	Tenant *Limit `json:"tenant,omitempty"`

	// key is the default per-api-key limit of the tier's tenants. Unset means no key limit.
	// +optional
	Key *Limit `json:"key,omitempty"`

	// hard tenants never borrow from the burst pool.
	// +optional
	Hard bool `json:"hard,omitempty"`

	// priorityBase is the tier's base score in percent, 0 to 100, in seed
	// 004's priority score (see TenantQuota spec.priority), which classes
	// the tier's tenants on a degraded Upstream. Default by the tier's rank
	// in priority order (weight descending, then name), the rule
	// policy.DefaultPriorityBase: 70 for the first tier down to 10 for the
	// last, evenly spaced, not rounded (four tiers: 70, 50, 30, 10, the
	// seed's enterprise, business, starter, free; three: 70, 40, 10; one:
	// 70).
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100
	PriorityBase *int64 `json:"priorityBase,omitempty"`
}

// OutageWebhook is where class-change notices are posted: one JSON object
// per change of a tenant's class on an Upstream (seed 004's proactive
// communication), retried with backoff, dropped and counted when the
// receiver lags far behind.
type OutageWebhook struct {
	// url receives the notices, an absolute https (or http) URL with a host.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:XValidation:rule="isURL(self) && url(self).getScheme() in ['http', 'https'] && url(self).getHostname() != ''",message="url must be an absolute https or http URL with a host, such as https://hooks.example.com/quotaplane"
	URL string `json:"url"`

	// secretRef names the Secret entry whose value signs each body with
	// HMAC-SHA256, sent as X-Quotaplane-Signature: sha256=<hex>. Unset:
	// notices are not signed.
	// +optional
	SecretRef *SecretKeyReference `json:"secretRef,omitempty"`
}

// Outage configures what the plane does when an Upstream degrades.
type Outage struct {
	// webhook receives a notice for each change of a tenant's class.
	// +optional
	Webhook *OutageWebhook `json:"webhook,omitempty"`
}

// EnforcerFleet says how the manager scales the enforcer Deployment.
// +kubebuilder:validation:XValidation:rule="!has(self.minReplicas) || !has(self.maxReplicas) || self.minReplicas <= self.maxReplicas",message="minReplicas must not exceed maxReplicas; lower minReplicas or raise maxReplicas"
type EnforcerFleet struct {
	// deploymentName is the enforcer Deployment in the plane's namespace.
	// The manager scales it only if it carries the label
	// quotaplane.io/enforcer: "true" (the shipped manifests set it): a
	// QuotaPlane cannot make the manager scale any other Deployment.
	// +optional
	DeploymentName string `json:"deploymentName,omitempty"`

	// minReplicas is the fewest enforcers, at most maxReplicas. Default 1.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1000
	MinReplicas int32 `json:"minReplicas,omitempty"`

	// maxReplicas is the most enforcers, 1 to 1000 (the manager caps it
	// further with its --max-enforcer-replicas). Default 10, or minReplicas
	// when that is larger.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000
	MaxReplicas int32 `json:"maxReplicas,omitempty"`

	// targetRatePerReplica is the decision rate (per second) one enforcer should carry.
	// +optional
	// +kubebuilder:validation:Minimum=1
	TargetRatePerReplica int64 `json:"targetRatePerReplica,omitempty"`
}

// QuotaPlaneSpec is what belongs to the whole plane.
// +kubebuilder:validation:XValidation:rule="self.tiers.map(t, has(t.floorPercent) ? t.floorPercent : 0).sum() <= 100",fieldPath=".tiers",message="tier floors add up to more than 100%; they must add up to at most 100% of the global limit: lower some floorPercent"
// +kubebuilder:validation:XValidation:rule="!has(self.defaultTier) || self.tiers.exists(t, t.name == self.defaultTier)",fieldPath=".defaultTier",message="defaultTier is not one of the tiers; name one of them or leave defaultTier unset"
type QuotaPlaneSpec struct {
	// global is the limit on all traffic of the plane. It must be a
	// tokenBucket: fairness and reconciliation work on its refill rate.
	// +required
	// +kubebuilder:validation:XValidation:rule="!has(self.algorithm) || self.algorithm == 'tokenBucket'",fieldPath=".algorithm",message="the global limit must be a tokenBucket: fairness and reconciliation work on its refill rate; remove algorithm or set it to tokenBucket"
	Global Limit `json:"global"`

	// mode is where decisions are made. local: in each enforcer alone, every
	// limit per enforcer (N replicas admit N times it; the manager keeps a
	// local plane at one replica). central: every decision in Redis, every
	// level exact fleet-wide under any routing, at a Redis round trip per
	// batch. local-reconciled: in each enforcer on its part of every limit,
	// which follows where that limit's demand arrives, reconciled with Redis
	// every reconcileInterval: every level within a few percent under any
	// routing (round robin, pinned by tenant, skewed), limits too small to
	// split over the nodes decided in Redis. docs/modes.md has the table.
	// Default local.
	// +optional
	Mode Mode `json:"mode,omitempty"`

	// reconcileInterval is how often local-reconciled enforcers reconcile with
	// Redis: a duration from 10ms to 1h. Default 200ms.
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:XValidation:rule="self.matches('^(([0-9]+([.][0-9]*)?|[.][0-9]+)(ns|us|µs|μs|ms|s|m|h))+$') && duration(self) >= duration('10ms') && duration(self) <= duration('1h')",message="reconcileInterval is out of range; use a duration from 10ms to 1h (default 200ms)"
	ReconcileInterval *metav1.Duration `json:"reconcileInterval,omitempty"`

	// shards is how many Redis Cluster slots the plane's central state
	// spreads over (mode central). Each tenant lives in one shard with a part
	// of the global limit, rebalanced by demand. Default 1: one slot, exact.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=64
	Shards int32 `json:"shards,omitempty"`

	// fairness is how contended global capacity is shared: none, maxmin, wfq
	// or drr, fleet-wide in every mode (central and local-reconciled exchange
	// tenants' demand through Redis). Default maxmin.
	// +optional
	Fairness Fairness `json:"fairness,omitempty"`

	// shareBy is whose weight contended global capacity is shared by:
	// tenant (seed 002: every tenant a flow weighted by its tier's weight or
	// its own, so a tier's total grows with its busy tenants) or tier (the
	// tiers by their weights, then each tier's share among its tenants, so
	// a tier's total does not depend on how many tenants it has). Tier
	// floors and shed order hold in both. Default tenant.
	// +optional
	ShareBy ShareBy `json:"shareBy,omitempty"`

	// failureMode is what enforcers of a central or local-reconciled plane do
	// while Redis is unreachable (central: the circuit breaker is open;
	// local-reconciled: three reconciles in a row failed): degrade, allow or
	// deny. The enforcer's quotaplane_enforcer_backend_degraded metric says when it is in
	// force, and it logs entering and leaving it. Default degrade.
	// +optional
	FailureMode FailureMode `json:"failureMode,omitempty"`

	// defaultTier is the tier of tenants that name none and of unknown tenants;
	// it must be one of tiers. Defaults to the tier with the lowest weight.
	// +optional
	// +kubebuilder:validation:MaxLength=63
	DefaultTier string `json:"defaultTier,omitempty"`

	// unknownTenants is what happens to tenants without a TenantQuota: default
	// (the default tier's limits) or deny. Default default.
	// +optional
	UnknownTenants UnknownPolicy `json:"unknownTenants,omitempty"`

	// unknownEndpoints is what happens to endpoints without an EndpointQuota:
	// default (cost 1, no endpoint limit) or deny. Default default.
	// +optional
	UnknownEndpoints UnknownPolicy `json:"unknownEndpoints,omitempty"`

	// keyBinding is open (default: a request may name any tenant with any api
	// key) or bound: a request's api key must be one of its tenant's keys
	// (TenantQuota spec.keyHashes or spec.keySecretRef), else it is refused
	// with level key and charged to no one. Bound also refuses requests
	// without a key, and so every tenant without keys.
	// +optional
	KeyBinding KeyBinding `json:"keyBinding,omitempty"`

	// descriptors maps the entries of Envoy rate limit descriptors (the
	// enforcer's gRPC rate limit service) onto tenant, endpoint and api key.
	// Default: the entry keys tenant, endpoint and api_key.
	// +optional
	Descriptors *DescriptorMapping `json:"descriptors,omitempty"`

	// tiers are the plane's tenant classes: 1 to 16, with unique names and
	// floors that add up to at most 100.
	// +required
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=16
	// +listType=map
	// +listMapKey=name
	Tiers []Tier `json:"tiers"`

	// enforcer says how the manager scales the enforcer fleet.
	// +optional
	Enforcer EnforcerFleet `json:"enforcer,omitempty"`

	// outage configures what the plane does when one of its Upstreams
	// degrades (seed 004): the class-change webhook.
	// +optional
	Outage *Outage `json:"outage,omitempty"`
}

// Conditions of the QuotaPlane besides Ready.
const (
	// ConditionEnforced is True when every enforcer that reports on the
	// plane runs its published version (and at least one does), False while
	// the fleet rolls out or none reports, Unknown while the reports cannot
	// be read. Ready says the plane is valid and published; Enforced says
	// the fleet runs it.
	ConditionEnforced = "Enforced"
	// ConditionReconciling and ConditionStalled are kstatus's (Flux's)
	// conditions, abnormal-true: Reconciling while the plane's latest
	// version is not yet enforced, Stalled while an object needs a fix
	// (the plane or some object is rejected or held).
	ConditionReconciling = "Reconciling"
	ConditionStalled     = "Stalled"
)

// QuotaPlaneStatus is the published state of the plane.
type QuotaPlaneStatus struct {
	QuotaStatus `json:",inline"`

	// publishedVersion is the policy version last published to Redis.
	// +optional
	PublishedVersion int64 `json:"publishedVersion,omitempty"`

	// publishedHash is the content hash of the published policy.
	// +optional
	PublishedHash string `json:"publishedHash,omitempty"`

	// enforcersReady is how many enforcers report the published version
	// loaded. It is 0 while their reports cannot be read (Redis away): the
	// Enforced condition is then Unknown, never a stale count.
	// +optional
	EnforcersReady int32 `json:"enforcersReady,omitempty"`

	// enforcers is how many enforcers report running a version of the
	// plane, whichever; a report lapses when its enforcer stops renewing it.
	// +optional
	Enforcers int32 `json:"enforcers,omitempty"`

	// rejectedObjects is how many quota objects of the namespace are left
	// out of the policy (Ready=False, reason Invalid or Duplicate): an
	// invalid object that was never in force, or a second QuotaPlane.
	// +optional
	RejectedObjects int32 `json:"rejectedObjects,omitempty"`

	// heldObjects is how many quota objects have an invalid edit whose last
	// valid version stays in force in its place (Ready=False, reason Held),
	// this QuotaPlane included.
	// +optional
	HeldObjects int32 `json:"heldObjects,omitempty"`

	// replicas is the enforcer Deployment's replica count the manager last set.
	// +optional
	Replicas int32 `json:"replicas,omitempty"`
}

// QuotaPlane is one quota plane: its global limit, tiers, mode and fairness.
// All quota objects in its namespace belong to it.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=qp
// +kubebuilder:printcolumn:name="Mode",type=string,JSONPath=`.spec.mode`
// +kubebuilder:printcolumn:name="Fairness",type=string,JSONPath=`.spec.fairness`,priority=1
// +kubebuilder:printcolumn:name="ShareBy",type=string,JSONPath=`.spec.shareBy`,priority=1
// +kubebuilder:printcolumn:name="Global",type=integer,JSONPath=`.spec.global.rate`,priority=1
// +kubebuilder:printcolumn:name="Version",type=integer,JSONPath=`.status.publishedVersion`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`
// +kubebuilder:printcolumn:name="Enforced",type=string,JSONPath=`.status.conditions[?(@.type=="Enforced")].status`
// +kubebuilder:printcolumn:name="Rollout",type=string,JSONPath=`.status.conditions[?(@.type=="Enforced")].reason`,priority=1
// +kubebuilder:printcolumn:name="Enforcers",type=integer,JSONPath=`.status.enforcersReady`
// +kubebuilder:printcolumn:name="Fleet",type=integer,JSONPath=`.status.enforcers`,priority=1
// +kubebuilder:printcolumn:name="Replicas",type=integer,JSONPath=`.status.replicas`,priority=1
// +kubebuilder:printcolumn:name="Rejected",type=integer,JSONPath=`.status.rejectedObjects`
// +kubebuilder:printcolumn:name="Held",type=integer,JSONPath=`.status.heldObjects`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:printcolumn:name="Message",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].message`,priority=1
type QuotaPlane struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   QuotaPlaneSpec   `json:"spec"`
	Status QuotaPlaneStatus `json:"status,omitempty"`
}

// QuotaPlaneList is a list of QuotaPlane.
// +kubebuilder:object:root=true
type QuotaPlaneList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []QuotaPlane `json:"items"`
}
