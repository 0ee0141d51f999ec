package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Rate is a rate: rate tokens per period, with nothing to store (no bucket,
// no burst): a capacity, not a limit.
type Rate struct {
	// rate is the number of the plane's tokens per period (an endpoint's
	// cost per request, as the limits count): 1 to 10^9.
	// +required
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000000000
	Rate int64 `json:"rate"`

	// period is the time rate is counted over, a Go duration such as 1s,
	// 1m or 24h: 1s to 24h. Defaults to 1s.
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:XValidation:rule="self.matches('^(([0-9]+([.][0-9]*)?|[.][0-9]+)(ns|us|µs|μs|ms|s|m|h))+$') && duration(self) >= duration('1s') && duration(self) <= duration('24h')",message="period is out of range; use a duration from 1s to 24h, such as 1s, 1m or 24h"
	Period *metav1.Duration `json:"period,omitempty"`
}

// SecretKeyReference names one entry of a Secret in the object's namespace.
type SecretKeyReference struct {
	// name is the Secret's name.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`

	// key is the entry of the Secret's data whose value is used.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[-._a-zA-Z0-9]+$`
	Key string `json:"key"`
}

// HTTPMethod is a probe's request method.
// +kubebuilder:validation:Enum=GET;POST;HEAD
type HTTPMethod string

// The probe's methods.
const (
	MethodGet  HTTPMethod = "GET"
	MethodPost HTTPMethod = "POST"
	MethodHead HTTPMethod = "HEAD"
)

// HTTPHeader is one header a probe sends.
// +kubebuilder:validation:XValidation:rule="!has(self.value) || size(self.value) == 0 || !has(self.secretKeyRef)",message="a header takes its value from value or from secretKeyRef, not both; remove one"
type HTTPHeader struct {
	// name is the header's name, an HTTP token such as Authorization or
	// X-Api-Key. Names are compared without case: each header once.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=128
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9!#$%&'*+.^_|~-]+$`
	Name string `json:"name"`

	// value is the header's value: printable ASCII, spaces and tabs, at most
	// 1024. Empty when neither value nor secretKeyRef is set.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	// +kubebuilder:validation:Pattern=`^[\t -~]*$`
	Value string `json:"value,omitempty"`

	// secretKeyRef takes the value from an entry of a Secret in this
	// namespace (a trailing newline is dropped), read by the manager for
	// each probe: a provider's API key stays in the Secret.
	// +optional
	SecretKeyRef *SecretKeyReference `json:"secretKeyRef,omitempty"`
}

// RateLimitHeaders names the response headers a probe reads the provider's
// rate-limit state from: seed 004's quota signal.
type RateLimitHeaders struct {
	// remaining is the header with the requests left in the provider's
	// window. Default x-ratelimit-remaining-requests.
	// +optional
	// +kubebuilder:validation:MaxLength=128
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9!#$%&'*+.^_|~-]+$`
	Remaining string `json:"remaining,omitempty"`

	// limit is the header with the provider's limit for that window.
	// Default x-ratelimit-limit-requests.
	// +optional
	// +kubebuilder:validation:MaxLength=128
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9!#$%&'*+.^_|~-]+$`
	Limit string `json:"limit,omitempty"`

	// ietf also reads the IETF fields (draft-ietf-httpapi-ratelimit-headers):
	// RateLimit's r (remaining) and RateLimit-Policy's q (limit), used when
	// the named headers are absent.
	// +optional
	IETF bool `json:"ietf,omitempty"`
}

// UpstreamProbe is seed 004's health probe: one HTTP request per interval,
// whose status, latency and rate-limit headers are samples of the
// upstream's capacity confidence.
// +kubebuilder:validation:XValidation:rule="(has(self.interval) && !self.interval.matches('^(([0-9]+([.][0-9]*)?|[.][0-9]+)(ns|us|µs|μs|ms|s|m|h))+$')) || (has(self.timeout) && !self.timeout.matches('^(([0-9]+([.][0-9]*)?|[.][0-9]+)(ns|us|µs|μs|ms|s|m|h))+$')) || (has(self.timeout) ? duration(self.timeout) : duration('5s')) < (has(self.interval) ? duration(self.interval) : duration('15s'))",fieldPath=".timeout",message="timeout must be shorter than interval (defaults 5s and 15s): a probe ends before the next starts; shorten timeout or lengthen interval"
// +kubebuilder:validation:XValidation:rule="!has(self.body) || size(self.body) == 0 || (has(self.method) && self.method == 'POST')",fieldPath=".body",message="a body is sent only with method POST; set method: POST or remove body"
type UpstreamProbe struct {
	// url is the probe's target, an absolute http or https URL with a host,
	// such as https://api.openai.com/v1/models.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:XValidation:rule="isURL(self) && url(self).getScheme() in ['http', 'https'] && url(self).getHostname() != ''",message="url must be an absolute http or https URL with a host, such as https://api.example.com/v1/models"
	URL string `json:"url"`

	// method is GET, POST or HEAD. Default GET.
	// +optional
	Method HTTPMethod `json:"method,omitempty"`

	// headers are sent with each probe, each name once (without case): at
	// most 16.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:XValidation:rule="self.all(h, self.filter(o, o.name.lowerAscii() == h.name.lowerAscii()).size() == 1)",message="a header is named twice (names are compared without case); keep one"
	Headers []HTTPHeader `json:"headers,omitempty"`

	// body is sent with method POST: at most 4096 bytes.
	// +optional
	// +kubebuilder:validation:MaxLength=4096
	Body string `json:"body,omitempty"`

	// interval is the time between probes: 1s to 10m. Default 15s.
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:XValidation:rule="self.matches('^(([0-9]+([.][0-9]*)?|[.][0-9]+)(ns|us|µs|μs|ms|s|m|h))+$') && duration(self) >= duration('1s') && duration(self) <= duration('10m')",message="interval is out of range; use a duration from 1s to 10m (default 15s)"
	Interval *metav1.Duration `json:"interval,omitempty"`

	// timeout is how long a probe may take, shorter than interval: 100ms
	// to 10m. A probe that takes longer is an error sample whose latency is
	// the timeout. Default 5s.
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:XValidation:rule="self.matches('^(([0-9]+([.][0-9]*)?|[.][0-9]+)(ns|us|µs|μs|ms|s|m|h))+$') && duration(self) >= duration('100ms') && duration(self) <= duration('10m')",message="timeout is out of range; use a duration from 100ms to 10m (default 5s), shorter than interval"
	Timeout *metav1.Duration `json:"timeout,omitempty"`

	// expectedStatuses are the response statuses that count as success,
	// each once: at most 16, each 100 to 599. Empty means any 2xx. Any
	// other status, and no answer, is an error sample.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:Minimum=100
	// +kubebuilder:validation:items:Maximum=599
	ExpectedStatuses []int32 `json:"expectedStatuses,omitempty"`

	// rateLimitHeaders names the headers the quota signal is read from.
	// Headers that are absent or do not parse are ignored: the quota signal
	// then counts as full, never as empty.
	// +optional
	RateLimitHeaders *RateLimitHeaders `json:"rateLimitHeaders,omitempty"`
}

// QuotaSignal says how the rate-limit headers become seed 004's quota
// penalty, 0.3·(1 − ratio).
// +kubebuilder:validation:Enum=Remaining;Limit
type QuotaSignal string

const (
	// QuotaSignalRemaining is the seed's: ratio = remaining / limit, for a
	// provider that throttles by draining its window.
	QuotaSignalRemaining QuotaSignal = "Remaining"
	// QuotaSignalLimit compares the limit header with the nominal capacity:
	// ratio = min(limit / capacity.rate, 1), for a provider that cuts its
	// limit in an outage. It needs capacity in the unit and period of the
	// provider's limit header.
	QuotaSignalLimit QuotaSignal = "Limit"
)

// Sensing says whether an upstream's confidence is sensed and acted on.
// (Not On and Off: YAML 1.1, which kubectl reads, takes those for booleans.)
// +kubebuilder:validation:Enum=Enabled;Disabled
type Sensing string

const (
	// SensingEnabled senses the upstream and reclassifies its tenants
	// when its confidence drops.
	SensingEnabled Sensing = "Enabled"
	// SensingDisabled declares the upstream but never leaves Healthy: the
	// static tiers alone, for comparisons.
	SensingDisabled Sensing = "Disabled"
)

// UpstreamSpec describes one upstream: its nominal capacity, the endpoints
// that draw on it and how its health is sensed.
// +kubebuilder:validation:XValidation:rule="(has(self.sensing) && self.sensing == 'Disabled') || has(self.probe) || !has(self.passive) || self.passive",message="an upstream with sensing Enabled needs a signal: add a probe, set passive: true, or set sensing: Disabled"
type UpstreamSpec struct {
	// capacity is the upstream's nominal capacity in the plane's tokens
	// (an endpoint's cost per request, as the limits count), such as
	// {rate: 600, period: 1m}. While the upstream is degraded its endpoints
	// share capacity × confidence among the priority classes.
	// +required
	Capacity Rate `json:"capacity"`

	// endpoints are the EndpointQuota endpoint names that draw on this
	// upstream: 1 to 256, each once. That each is an EndpointQuota of the
	// plane, and that no endpoint draws on two upstreams, are checks across
	// objects, made by the manager, which sets Ready=False naming the
	// endpoint.
	// +required
	// +listType=set
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=256
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=128
	// +kubebuilder:validation:items:Pattern=`^[A-Za-z0-9._~-]+$`
	Endpoints []string `json:"endpoints"`

	// probe is an active health probe the leader manager sends. Unset: no
	// probe, the passive reports alone.
	// +optional
	Probe *UpstreamProbe `json:"probe,omitempty"`

	// passive takes reports of real calls from the data path (POST
	// /quota/upstream/report to an enforcer). Default true.
	// +optional
	Passive *bool `json:"passive,omitempty"`

	// window is the rolling window samples are kept in: 1m to 1h. Default 5m.
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:XValidation:rule="self.matches('^(([0-9]+([.][0-9]*)?|[.][0-9]+)(ns|us|µs|μs|ms|s|m|h))+$') && duration(self) >= duration('1m') && duration(self) <= duration('1h')",message="window is out of range; use a duration from 1m to 1h (default 5m)"
	Window *metav1.Duration `json:"window,omitempty"`

	// latencyCeiling is the p95 latency at or above which the latency
	// penalty is the seed's full 0.2 (0.2·min(p95/latencyCeiling, 1)):
	// 10ms to 10m. Default 5s.
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:XValidation:rule="self.matches('^(([0-9]+([.][0-9]*)?|[.][0-9]+)(ns|us|µs|μs|ms|s|m|h))+$') && duration(self) >= duration('10ms') && duration(self) <= duration('10m')",message="latencyCeiling is out of range; use a duration from 10ms to 10m (default 5s)"
	LatencyCeiling *metav1.Duration `json:"latencyCeiling,omitempty"`

	// quotaSignal is how the rate-limit headers count: Remaining (the
	// seed's remaining/limit) or Limit (the limit header against
	// capacity.rate, for a provider that cuts its limit in an outage).
	// Default Remaining.
	// +optional
	QuotaSignal QuotaSignal `json:"quotaSignal,omitempty"`

	// sensing is Enabled (default) or Disabled: the upstream is declared
	// but never leaves Healthy, its tenants keep their static tiers (for
	// comparisons).
	// +optional
	Sensing Sensing `json:"sensing,omitempty"`
}

// UpstreamPhase is where an upstream stands between healthy and recovered.
// +kubebuilder:validation:Enum=Healthy;Degraded;Phase1;Phase2;Phase3
type UpstreamPhase string

// The phases, as pkg/upstream names them.
const (
	// PhaseHealthy: no gate, the static tiers.
	PhaseHealthy UpstreamPhase = "Healthy"
	// PhaseDegraded: the first cycle below healthy; capacity is cut at once.
	PhaseDegraded UpstreamPhase = "Degraded"
	// PhaseRecovery1: critical and high only.
	PhaseRecovery1 UpstreamPhase = "Phase1"
	// PhaseRecovery2: medium at 50 %, low suspended.
	PhaseRecovery2 UpstreamPhase = "Phase2"
	// PhaseRecovery3: medium at 100 %, low at 25 %.
	PhaseRecovery3 UpstreamPhase = "Phase3"
)

// UpstreamClasses counts the plane's named tenants (TenantQuotas) in each
// priority class on one upstream.
type UpstreamClasses struct {
	// critical tenants are reserved their nominal allocation first.
	// +optional
	Critical int32 `json:"critical,omitempty"`
	// high tenants share by weight 0.6.
	// +optional
	High int32 `json:"high,omitempty"`
	// medium tenants share by weight 0.3.
	// +optional
	Medium int32 `json:"medium,omitempty"`
	// low tenants share by weight 0.1.
	// +optional
	Low int32 `json:"low,omitempty"`
	// suspended tenants get 503 while the upstream is not Healthy.
	// +optional
	Suspended int32 `json:"suspended,omitempty"`
}

// UpstreamStatus is what the leader manager last sensed and decided.
type UpstreamStatus struct {
	QuotaStatus `json:",inline"`

	// confidence is seed 004's capacity confidence, 0 to 1, with two
	// decimals ("0.42"): the share of capacity the upstream is taken to
	// have.
	// +optional
	// +kubebuilder:validation:MaxLength=8
	// +kubebuilder:validation:Pattern=`^(0(\.[0-9]{1,3})?|1(\.0{1,3})?)$`
	Confidence string `json:"confidence,omitempty"`

	// phase is Healthy, Degraded, or a recovery phase: Phase1 (critical
	// and high only), Phase2 (medium at 50 %), Phase3 (medium at 100 %,
	// low at 25 %).
	// +optional
	Phase UpstreamPhase `json:"phase,omitempty"`

	// lastTransitionTime is when phase last changed.
	// +optional
	LastTransitionTime *metav1.Time `json:"lastTransitionTime,omitempty"`

	// lastProbeTime is when the last probe ended.
	// +optional
	LastProbeTime *metav1.Time `json:"lastProbeTime,omitempty"`

	// lastProbeError is why the last probe was an error sample (no answer,
	// a timeout, an unexpected status); empty when it succeeded.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	LastProbeError string `json:"lastProbeError,omitempty"`

	// classes count the named tenants in each class (tenants the plane
	// does not name are classed by tier and not counted).
	// +optional
	Classes *UpstreamClasses `json:"classes,omitempty"`
}

// Upstream is an upstream the plane's endpoints depend on (a model
// provider, any API with its own limits), seed 004's provider: when it
// loses capacity the leader manager reclassifies the tenants that use it
// into priority classes and shares what is left by class. It belongs to
// the QuotaPlane of its namespace, which holds at most 16 Upstreams (a
// check across objects, made by the manager, which sets Ready=False on the
// ones beyond, by name). Its name, a DNS label, names it in X-Quota-Reason,
// metrics and the class-change webhook.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=ups
// +kubebuilder:validation:XValidation:rule="self.metadata.name.size() <= 63 && self.metadata.name.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')",message="an Upstream's name must be a DNS label (lower-case letters, digits and '-', at most 63): rename it"
// +kubebuilder:printcolumn:name="Capacity",type=integer,JSONPath=`.spec.capacity.rate`
// +kubebuilder:printcolumn:name="Per",type=string,JSONPath=`.spec.capacity.period`,priority=1
// +kubebuilder:printcolumn:name="Confidence",type=string,JSONPath=`.status.confidence`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Since",type=date,JSONPath=`.status.lastTransitionTime`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:printcolumn:name="Message",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].message`,priority=1
type Upstream struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   UpstreamSpec   `json:"spec"`
	Status UpstreamStatus `json:"status,omitempty"`
}

// UpstreamList is a list of Upstream.
// +kubebuilder:object:root=true
type UpstreamList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Upstream `json:"items"`
}
