package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// EndpointTierLimit is an endpoint's per-tenant limit for the tenants of one tier.
type EndpointTierLimit struct {
	// tier is one of the QuotaPlane's tiers. That it exists is a check across
	// objects, made by the manager, which sets Ready=False when it fails.
	// +required
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Tier string `json:"tier"`

	// limit is the per-tenant limit on this endpoint for that tier's tenants.
	// +required
	Limit Limit `json:"limit"`
}

// PathMatchType says how a path is compared.
// +kubebuilder:validation:Enum=Exact;PathPrefix;Pattern
type PathMatchType string

const (
	// PathExact matches the path exactly.
	PathExact PathMatchType = "Exact"
	// PathPrefix matches the path and every path below it, segment by
	// segment: /v1/export matches /v1/export and /v1/export/7, not /v1/exports.
	PathPrefix PathMatchType = "PathPrefix"
	// PathPattern matches a path of as many segments, where a segment "*"
	// matches any one non-empty segment: /v1/models/*/generate.
	PathPattern PathMatchType = "Pattern"
)

// PathMatch is how a request path is matched.
// +kubebuilder:validation:XValidation:rule="!has(self.type) || self.type != 'Pattern' || self.value.split('/').exists(s, s == '*')",message="a Pattern needs at least one segment that is exactly '*'; use Exact or PathPrefix otherwise"
type PathMatch struct {
	// type is Exact, PathPrefix or Pattern. Default PathPrefix.
	// +optional
	Type PathMatchType `json:"type,omitempty"`

	// value is an absolute path without query: it starts with '/', has no
	// empty, '.' or '..' segments, and only the characters of a URL path.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=1024
	// +kubebuilder:validation:Pattern=`^/([A-Za-z0-9._~!$&'()*+,;=:@%-]+(/[A-Za-z0-9._~!$&'()*+,;=:@%-]+)*/?)?$`
	Value string `json:"value"`
}

// EndpointMatch classifies a forwarded request (forward auth) into this endpoint.
type EndpointMatch struct {
	// path matches the request's path (X-Forwarded-Uri without its query,
	// made canonical). A trailing '/' on the request does not take it out
	// of an Exact or Pattern match.
	// +required
	Path PathMatch `json:"path"`

	// methods match the request's method (X-Forwarded-Method); any method
	// when empty. GET also takes HEAD, which upstreams serve as GET.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=9
	// +kubebuilder:validation:items:Enum=GET;HEAD;POST;PUT;PATCH;DELETE;OPTIONS;CONNECT;TRACE
	Methods []string `json:"methods,omitempty"`
}

// EndpointQuotaSpec describes one endpoint.
type EndpointQuotaSpec struct {
	// endpoint is the endpoint name, as in POST /api/{endpoint}.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=128
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9._~-]+$`
	Endpoint string `json:"endpoint"`

	// cost is how many tokens one request to this endpoint takes at every level. Default 1.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000000
	Cost int64 `json:"cost,omitempty"`

	// limit is the per-tenant limit on this endpoint. Unset means no endpoint limit.
	// +optional
	Limit *Limit `json:"limit,omitempty"`

	// match lists the requests that forward auth (GET /forward-auth, with
	// X-Forwarded-Method and X-Forwarded-Uri) classifies into this endpoint.
	// Across all endpoints of the plane the most specific match wins: Exact
	// before Pattern before PathPrefix; then the longer value; then a match
	// with methods before one without; then the endpoint name. A request no
	// match takes is a request for no named endpoint (see the QuotaPlane's
	// unknownEndpoints); a PathPrefix of "/" is a catch-all default.
	// +optional
	// +kubebuilder:validation:MaxItems=16
	Match []EndpointMatch `json:"match,omitempty"`

	// tiers override limit for the tenants of a tier, each tier once.
	// +optional
	// +listType=map
	// +listMapKey=tier
	// +kubebuilder:validation:MaxItems=16
	Tiers []EndpointTierLimit `json:"tiers,omitempty"`
}

// EndpointQuota is one endpoint's cost and per-tenant limits.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=eq
// +kubebuilder:printcolumn:name="Endpoint",type=string,JSONPath=`.spec.endpoint`
// +kubebuilder:printcolumn:name="Cost",type=integer,JSONPath=`.spec.cost`
// +kubebuilder:printcolumn:name="Version",type=integer,JSONPath=`.status.policyVersion`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:printcolumn:name="Message",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].message`,priority=1
type EndpointQuota struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   EndpointQuotaSpec `json:"spec"`
	Status QuotaStatus       `json:"status,omitempty"`
}

// EndpointQuotaList is a list of EndpointQuota.
// +kubebuilder:object:root=true
type EndpointQuotaList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []EndpointQuota `json:"items"`
}
