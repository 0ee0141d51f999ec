package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

func metav1AddToGroupVersion(scheme *runtime.Scheme) {
	metav1.AddToGroupVersion(scheme, GroupVersion)
}

// Algorithm selects how a limit counts.
// +kubebuilder:validation:Enum=tokenBucket;slidingWindow
type Algorithm string

const (
	// TokenBucket refills rate tokens per period into a bucket of burst tokens.
	TokenBucket Algorithm = "tokenBucket"
	// SlidingWindow admits at most rate tokens in any window of one period
	// (an exact sliding log; for small limits such as "2 deletes per 300s").
	SlidingWindow Algorithm = "slidingWindow"
)

// Limit is one rate limit: rate tokens per period, with a bucket of burst tokens.
type Limit struct {
	// rate is the number of tokens added per period. 0 means no refill: the
	// bucket holds burst tokens for the life of the state.
	// +required
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1000000000
	Rate int64 `json:"rate"`

	// burst is the bucket size: the most tokens one can spend at once. Defaults
	// to rate (or 1 when rate is 0). Ignored by slidingWindow, whose window holds rate.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000000000
	Burst int64 `json:"burst,omitempty"`

	// period is the time over which rate tokens are added. Defaults to 1s.
	// +optional
	Period *metav1.Duration `json:"period,omitempty"`

	// algorithm is tokenBucket (the default) or slidingWindow.
	// +optional
	Algorithm Algorithm `json:"algorithm,omitempty"`
}

// Common condition types and reasons written by the manager.
const (
	// ConditionReady is True when the object is valid and included in the published policy.
	ConditionReady = "Ready"
)

// QuotaStatus is the status every quota object shares.
type QuotaStatus struct {
	// observedGeneration is the generation the status was computed from.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// policyVersion is the published policy version that includes this object.
	// +optional
	PolicyVersion int64 `json:"policyVersion,omitempty"`

	// conditions say whether the object is valid and published, and if not, how to fix it.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}
