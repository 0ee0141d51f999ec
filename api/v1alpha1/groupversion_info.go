// Package v1alpha1 holds the quotaplane.io/v1alpha1 API: the custom resources that
// describe a quota plane (QuotaPlane), its tenants (TenantQuota), its endpoints
// (EndpointQuota), its shared burst pool (BurstPool) and the upstreams its
// endpoints depend on (Upstream).
//
// All objects of one plane live in one namespace. The types carry no logic beyond
// defaults; pkg/policy compiles them into the immutable policy the enforcers load.
//
// +kubebuilder:object:generate=true
// +groupName=quotaplane.io
package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupVersion is the group and version of every kind in this package.
var GroupVersion = schema.GroupVersion{Group: "quotaplane.io", Version: "v1alpha1"}

var (
	// SchemeBuilder registers the kinds of this package with a runtime.Scheme.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)
	// AddToScheme adds the kinds of this package to a runtime.Scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

func addKnownTypes(scheme *runtime.Scheme) error {
	scheme.AddKnownTypes(GroupVersion,
		&QuotaPlane{}, &QuotaPlaneList{},
		&TenantQuota{}, &TenantQuotaList{},
		&EndpointQuota{}, &EndpointQuotaList{},
		&BurstPool{}, &BurstPoolList{},
		&Upstream{}, &UpstreamList{},
	)
	metav1AddToGroupVersion(scheme)
	return nil
}
