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
//
// The rules below are Compile's (pkg/policy) checks of one limit, made at
// admission. The burst × period rule mirrors Compile's order: it is checked
// only once period itself is valid (period's own rules report the rest), so
// it never fails on a period it cannot read. Without cel.bind (not in the
// API server's CEL environment) the effective burst is spelt out: slidingWindow,
// or burst unset, means max(rate, 1).
// +kubebuilder:validation:XValidation:rule="!has(self.algorithm) || self.algorithm != 'slidingWindow' || (self.rate >= 1 && self.rate <= 10000)",fieldPath=".rate",message="a slidingWindow keeps one entry per request, so its rate must be 1 to 10000; use tokenBucket for larger limits"
// +kubebuilder:validation:XValidation:rule="!has(self.period) || !self.period.matches('^(([0-9]+([.][0-9]*)?|[.][0-9]+)(ns|us|µs|μs|ms|s|m|h))+$') || duration(self.period) < duration('1ms') || duration(self.period) > duration('8784h') || int(duration(self.period)) % 1000 != 0 || ((has(self.algorithm) && self.algorithm == 'slidingWindow') || !has(self.burst) ? (self.rate > 1 ? self.rate : 1) : self.burst) <= 9007199254740992 / (int(duration(self.period)) / 1000)",message="burst × period is too large to count exactly (burst × period in µs must be at most 2^53); shorten the period or lower the burst"
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

	// period is the time over which rate tokens are added, a Go duration
	// such as 500ms, 1s, 5m or 1h30m: 1ms to 8784h (366 days), in whole
	// microseconds. Defaults to 1s.
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:XValidation:rule="self.matches('^(([0-9]+([.][0-9]*)?|[.][0-9]+)(ns|us|µs|μs|ms|s|m|h))+$') && duration(self) >= duration('1ms') && duration(self) <= duration('8784h')",message="period is out of range; use a duration from 1ms to 8784h (366 days), such as 500ms, 1s, 5m or 1h30m"
	// +kubebuilder:validation:XValidation:rule="!self.matches('^(([0-9]+([.][0-9]*)?|[.][0-9]+)(ns|us|µs|μs|ms|s|m|h))+$') || int(duration(self)) % 1000 == 0",message="period has sub-microsecond precision; round it to whole microseconds"
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
	// +kubebuilder:validation:MaxItems=16
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}
