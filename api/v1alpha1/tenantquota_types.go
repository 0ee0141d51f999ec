package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// KeyQuota overrides the limit of one api key of a tenant.
type KeyQuota struct {
	// key is the api key, as sent in X-Api-Key: 1 to 256 printable ASCII
	// characters without spaces.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=256
	// +kubebuilder:validation:XValidation:rule="self.matches('^[!-~]*$')",message="key cannot be sent in X-Api-Key; use 1 to 256 printable ASCII characters without spaces"
	Key string `json:"key"`

	// limit is the key's limit.
	// +required
	Limit Limit `json:"limit"`
}

// TenantEndpointQuota overrides one endpoint's limit for a tenant.
type TenantEndpointQuota struct {
	// endpoint is the endpoint name, as in POST /api/{endpoint}. It must name
	// an EndpointQuota of the plane: the manager checks that (an object
	// cannot see the others when it is admitted) and sets Ready=False if not.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=128
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9._~-]+$`
	Endpoint string `json:"endpoint"`

	// limit is the tenant's limit on this endpoint.
	// +required
	Limit Limit `json:"limit"`
}

// SecretReference names a Secret in the object's namespace.
type SecretReference struct {
	// name is the Secret's name.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
}

// TenantPriority are a tenant's signals in seed 004's priority score, which
// decides its class on an Upstream that loses capacity:
//
//	score = min(1, base + 0.15·min(contractValue/500000, 1) + 0.10·realtime
//	              + 0.05·usage + 0.10·importance/100)
//
// where base is its tier's priorityBase (QuotaPlane) and usage its live
// usage ratio. Unset signals count 0.
type TenantPriority struct {
	// contractValue is the tenant's annual contract value in USD (the
	// seed's arr_usd): it adds 0.15·min(contractValue/500000, 1) to the
	// score, so 500000 and above add the full 0.15. 0 to 10^12.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1000000000000
	ContractValue int64 `json:"contractValue,omitempty"`

	// realtime declares a real-time, customer-facing workload (the seed's
	// is_realtime_workload), not a batch job: it adds 0.10 to the score.
	// +optional
	Realtime bool `json:"realtime,omitempty"`

	// importance is a manually set weight in percent, 0 to 100 (the seed's
	// importance_weight, 0.0 to 1.0): it adds 0.10·importance/100 to the
	// score.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100
	Importance int64 `json:"importance,omitempty"`
}

// TenantQuotaSpec describes one tenant's quota.
type TenantQuotaSpec struct {
	// tenant is the tenant id, as sent in X-Tenant: 1 to 256 printable ASCII
	// characters without spaces.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=256
	// +kubebuilder:validation:XValidation:rule="self.matches('^[!-~]*$')",message="tenant cannot be sent in X-Tenant; use 1 to 256 printable ASCII characters without spaces"
	Tenant string `json:"tenant"`

	// tier is the tenant's tier, one of the QuotaPlane's tiers. Defaults to
	// the plane's defaultTier. That the tier exists is a check across
	// objects: the ValidatingAdmissionPolicy quotaplane-tenant-tier
	// (config/admission) refuses a tier the namespace's QuotaPlane does not
	// define, and the manager checks it again (policy.Compile): a new
	// TenantQuota with an unknown tier is left out, an edit to one keeps the
	// tenant's last valid version in force (Ready=False, reason Held).
	// +optional
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Tier string `json:"tier,omitempty"`

	// limit overrides the tier's per-tenant limit.
	// +optional
	Limit *Limit `json:"limit,omitempty"`

	// weight overrides the tier's fairness weight for this tenant.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000000
	Weight *int64 `json:"weight,omitempty"`

	// hard overrides the tier's hard flag: a hard tenant never borrows from the burst pool.
	// +optional
	Hard *bool `json:"hard,omitempty"`

	// shards splits a whale tenant's buckets over this many of the plane's
	// shards (mode central), each with an even part of its limits, so that
	// its traffic is not bound to one Redis key's throughput. An api key's
	// requests stay in one part. Default 1; at most the plane's shards (a
	// check across objects, made by the manager, which sets Ready=False).
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=64
	Shards *int32 `json:"shards,omitempty"`

	// keys override the tier's per-key limit for named api keys, each key once.
	// +optional
	// +listType=map
	// +listMapKey=key
	// +kubebuilder:validation:MaxItems=1000
	Keys []KeyQuota `json:"keys,omitempty"`

	// keyHashes are the tenant's api keys by SHA-256: "sha256:" and 64
	// lower-case hex digits, as `printf %s "$KEY" | sha256sum` prints them.
	// With the QuotaPlane's keyBinding bound, a request for this tenant must
	// carry one of these keys or one of keySecretRef's. A key belongs to
	// one tenant.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=1000
	// +kubebuilder:validation:items:Pattern=`^sha256:[0-9a-f]{64}$`
	KeyHashes []string `json:"keyHashes,omitempty"`

	// keySecretRef names a Secret in this namespace each of whose data
	// values is one of the tenant's api keys: the key itself (a trailing
	// newline is dropped) or its hash as in keyHashes. The manager compiles
	// only their hashes; the keys never leave the Secret.
	// +optional
	KeySecretRef *SecretReference `json:"keySecretRef,omitempty"`

	// priority are the tenant's signals in seed 004's priority score, which
	// decides its class on a degraded Upstream. Unset: its tier's base
	// score alone (and its usage), as for a tenant the plane does not name.
	// +optional
	Priority *TenantPriority `json:"priority,omitempty"`

	// endpoints override endpoint limits for this tenant, each endpoint once.
	// +optional
	// +listType=map
	// +listMapKey=endpoint
	// +kubebuilder:validation:MaxItems=256
	Endpoints []TenantEndpointQuota `json:"endpoints,omitempty"`
}

// TenantQuota is one tenant's quota within the plane of its namespace.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=tq
// +kubebuilder:printcolumn:name="Tenant",type=string,JSONPath=`.spec.tenant`
// +kubebuilder:printcolumn:name="Tier",type=string,JSONPath=`.spec.tier`
// +kubebuilder:printcolumn:name="Version",type=integer,JSONPath=`.status.policyVersion`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:printcolumn:name="Message",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].message`,priority=1
type TenantQuota struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   TenantQuotaSpec `json:"spec"`
	Status QuotaStatus     `json:"status,omitempty"`
}

// TenantQuotaList is a list of TenantQuota.
// +kubebuilder:object:root=true
type TenantQuotaList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []TenantQuota `json:"items"`
}
