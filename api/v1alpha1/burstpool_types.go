package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// BurstPoolSpec describes the plane's shared burst pool.
// +kubebuilder:validation:XValidation:rule="self.perTenantCeiling <= self.size",fieldPath=".perTenantCeiling",message="perTenantCeiling must be at most the pool size; lower perTenantCeiling or raise size"
type BurstPoolSpec struct {
	// size is the most tokens the pool holds.
	// +required
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000000000
	Size int64 `json:"size"`

	// refillRate is how many tokens per second flow back into the pool; a
	// tenant's borrow debt is repaid at the same rate.
	// +required
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1000000000
	RefillRate int64 `json:"refillRate"`

	// perTenantCeiling is the most a single tenant may owe the pool, at most size.
	// +required
	// +kubebuilder:validation:Minimum=1
	PerTenantCeiling int64 `json:"perTenantCeiling"`

	// tiers lists the tiers whose soft tenants may borrow. Empty means every
	// soft tenant. Each must be one of the QuotaPlane's tiers: a check across
	// objects, made by the manager, which sets Ready=False when it fails.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:MaxLength=63
	// +kubebuilder:validation:items:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Tiers []string `json:"tiers,omitempty"`
}

// BurstPool is the plane's shared pool of burst tokens that soft tenants borrow from.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=bp
// +kubebuilder:printcolumn:name="Size",type=integer,JSONPath=`.spec.size`
// +kubebuilder:printcolumn:name="Refill",type=integer,JSONPath=`.spec.refillRate`
// +kubebuilder:printcolumn:name="Ceiling",type=integer,JSONPath=`.spec.perTenantCeiling`
// +kubebuilder:printcolumn:name="Version",type=integer,JSONPath=`.status.policyVersion`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:printcolumn:name="Message",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].message`,priority=1
type BurstPool struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   BurstPoolSpec `json:"spec"`
	Status QuotaStatus   `json:"status,omitempty"`
}

// BurstPoolList is a list of BurstPool.
// +kubebuilder:object:root=true
type BurstPoolList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []BurstPool `json:"items"`
}
