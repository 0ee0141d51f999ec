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
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
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
