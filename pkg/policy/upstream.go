package policy

import (
	"cmp"
	"fmt"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/quotaplane/quotaplane/api/v1alpha1"
)

// Upstreams are seed 004's providers (the Upstream kind, pkg/upstream's
// pipeline). They are checked against a policy but are not part of its
// content: the leader manager senses them and publishes its plan beside the
// policy, and the enforcers read the plan, never an Upstream. So editing an
// Upstream leaves the policy's hash alone, and a decoded policy has none.
// CompileUpstreams is the one validator: Compile runs it to report their
// problems (the check command, file mode), the manager to compile them.

// Bounds and defaults of an Upstream, the CRD's.
const (
	// MaxUpstreams bounds the Upstreams of a plane (pkg/upstream's plans).
	MaxUpstreams = 16
	// MaxUpstreamEndpoints bounds the endpoints of one Upstream.
	MaxUpstreamEndpoints = 256

	DefaultCapacityPeriod = time.Second
	MinCapacityPeriod     = time.Second
	MaxCapacityPeriod     = 24 * time.Hour

	DefaultProbeInterval = 15 * time.Second
	MinProbeInterval     = time.Second
	MaxProbeInterval     = 10 * time.Minute
	DefaultProbeTimeout  = 5 * time.Second
	MinProbeTimeout      = 100 * time.Millisecond
	MaxProbeTimeout      = 10 * time.Minute

	DefaultUpstreamWindow = 5 * time.Minute
	MinUpstreamWindow     = time.Minute
	MaxUpstreamWindow     = time.Hour
	DefaultLatencyCeiling = 5 * time.Second
	MinLatencyCeiling     = 10 * time.Millisecond
	MaxLatencyCeiling     = 10 * time.Minute

	MaxURLBytes         = 2048
	MaxProbeHeaders     = 16
	MaxHeaderNameBytes  = 128
	MaxHeaderValueBytes = 1024
	MaxProbeBodyBytes   = 4096
	MaxExpectedStatuses = 16

	// DefaultRemainingHeader and DefaultLimitHeader are the rate-limit
	// headers seed 004's probe reads (OpenAI's).
	DefaultRemainingHeader = "x-ratelimit-remaining-requests"
	DefaultLimitHeader     = "x-ratelimit-limit-requests"
)

// The quota signals (Upstream spec.quotaSignal); the default is the first.
const (
	// QuotaSignalRemaining: the seed's remaining / limit.
	QuotaSignalRemaining = "Remaining"
	// QuotaSignalLimit: min(limit / Capacity.Rate, 1), for a provider that
	// cuts its limit in an outage.
	QuotaSignalLimit = "Limit"
)

// The values of an Upstream's enumerated fields; the default is the first.
var (
	ProbeMethods = []string{"GET", "POST", "HEAD"}
	QuotaSignals = []string{QuotaSignalRemaining, QuotaSignalLimit}
	SensingModes = []string{string(v1alpha1.SensingEnabled), string(v1alpha1.SensingDisabled)}
)

// Rate is a compiled rate: Rate tokens per Period.
type Rate struct {
	Rate   int64         `json:"rate"`
	Period time.Duration `json:"period"`
}

// PerSecond is the rate in tokens per second.
func (r Rate) PerSecond() float64 { return float64(r.Rate) / r.Period.Seconds() }

// Upstream is a compiled Upstream with every default applied.
type Upstream struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// Capacity is the nominal capacity in the plane's tokens.
	Capacity Rate `json:"capacity"`
	// Endpoints draw on the upstream, sorted; each is an endpoint of the
	// policy it was compiled against, and draws on no other upstream.
	Endpoints []string `json:"endpoints"`
	// Probe is nil when the upstream is not probed.
	Probe *Probe `json:"probe,omitempty"`
	// Passive takes the data path's reports.
	Passive        bool          `json:"passive"`
	Window         time.Duration `json:"window"`
	LatencyCeiling time.Duration `json:"latencyCeiling"`
	// QuotaSignal is QuotaSignalRemaining or QuotaSignalLimit.
	QuotaSignal string `json:"quotaSignal"`
	// Sensing false: the upstream never leaves Healthy (sensing Disabled).
	Sensing bool `json:"sensing"`
}

// Probe is a compiled health probe.
type Probe struct {
	URL      string        `json:"url"`
	Method   string        `json:"method"`
	Headers  []Header      `json:"headers,omitempty"` // sorted by name
	Body     string        `json:"body,omitempty"`
	Interval time.Duration `json:"interval"`
	Timeout  time.Duration `json:"timeout"`
	// ExpectedStatuses are sorted; nil means any 2xx (Expects).
	ExpectedStatuses []int `json:"expectedStatuses,omitempty"`
	// RemainingHeader and LimitHeader name the rate-limit headers; IETF
	// also reads RateLimit (r) and RateLimit-Policy (q) when they are absent.
	RemainingHeader string `json:"remainingHeader"`
	LimitHeader     string `json:"limitHeader"`
	IETF            bool   `json:"ietf,omitempty"`
}

// Expects reports whether a probe answered with status succeeded.
func (p *Probe) Expects(status int) bool {
	if p.ExpectedStatuses == nil {
		return status >= 200 && status <= 299
	}
	_, found := slices.BinarySearch(p.ExpectedStatuses, status)
	return found
}

// Header is one header a probe sends: Value, or the value of the Secret
// entry SecretRef names (read by the prober, never compiled).
type Header struct {
	Name      string        `json:"name"`
	Value     string        `json:"value,omitempty"`
	SecretRef *SecretKeyRef `json:"secretRef,omitempty"`
}

// SecretKeyRef names one entry of a Secret in the object's namespace.
type SecretKeyRef struct {
	Name string `json:"name"`
	Key  string `json:"key"`
}

var (
	headerName  = regexp.MustCompile(`^[A-Za-z0-9!#$%&'*+.^_|~-]+$`)
	headerValue = regexp.MustCompile(`^[\t -~]*$`)
	secretKey   = regexp.MustCompile(`^[-._a-zA-Z0-9]+$`)
)

// ValidHTTPURL reports whether s is what a probe and the class-change
// webhook may call: an absolute http or https URL with a host, at most
// MaxURLBytes, as the CRD's CEL rule (isURL, url().getScheme(),
// getHostname()) reads it.
func ValidHTTPURL(s string) bool {
	if len(s) == 0 || len(s) > MaxURLBytes {
		return false
	}
	if _, err := url.ParseRequestURI(s); err != nil {
		return false
	}
	u, err := url.Parse(s)
	return err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Hostname() != ""
}

// CompileUpstreams compiles the Upstreams of the plane p and checks them
// against it, sorted by name: the valid ones, and a problem for each that
// is not. Across objects, each endpoint must be one of p's and draw on one
// upstream only (the first by name keeps it), and the plane holds at most
// MaxUpstreams (the first by name are kept). With p nil only each object's
// own fields are checked.
func CompileUpstreams(p *Policy, objs []*v1alpha1.Upstream) ([]Upstream, []Problem) {
	var list []Problem
	sorted := slices.Clone(objs)
	slices.SortFunc(sorted, func(a, b *v1alpha1.Upstream) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	claimed := map[string]string{} // endpoint → the upstream it draws on
	var out []Upstream
	for _, o := range sorted {
		ps := newProblems(&list, "Upstream", o)
		if p != nil && o.Namespace != p.spec.Namespace {
			ps.add("metadata.namespace", "object is in namespace %q but the plane %s is in %q; all objects of a plane live in its namespace", o.Namespace, p.spec.Plane, p.spec.Namespace)
			continue
		}
		u, ok := compileUpstream(o, ps)
		if !ok {
			continue
		}
		if p != nil {
			for i, e := range o.Spec.Endpoints {
				field := fmt.Sprintf("spec.endpoints[%d]", i)
				if _, ok := p.EndpointIndex(e); !ok {
					ps.add(field, "endpoint %q has no valid EndpointQuota in this plane; create one or remove it from endpoints", e)
				} else if other, taken := claimed[e]; taken {
					ps.add(field, "endpoint %q already draws on Upstream %s; an endpoint draws on one upstream: remove it from one of them", e, other)
				}
			}
		}
		if ps.found {
			continue
		}
		if len(out) == MaxUpstreams {
			ps.add("", "the plane already has %d Upstreams (%s, …, %s); a plane has at most %d: delete one or merge them", MaxUpstreams, out[0].Name, out[len(out)-1].Name, MaxUpstreams)
			continue
		}
		for _, e := range u.Endpoints {
			claimed[e] = u.Name
		}
		out = append(out, u)
	}
	return out, sortProblems(list)
}

// compileUpstream checks one Upstream's own fields and applies the defaults.
func compileUpstream(o *v1alpha1.Upstream, ps *problems) (Upstream, bool) {
	s := o.Spec
	u := Upstream{
		Namespace:      o.Namespace,
		Name:           o.Name,
		Capacity:       Rate{Rate: s.Capacity.Rate, Period: DefaultCapacityPeriod},
		Passive:        s.Passive == nil || *s.Passive,
		Window:         duration(ps, "spec.window", s.Window, DefaultUpstreamWindow, MinUpstreamWindow, MaxUpstreamWindow),
		LatencyCeiling: duration(ps, "spec.latencyCeiling", s.LatencyCeiling, DefaultLatencyCeiling, MinLatencyCeiling, MaxLatencyCeiling),
		QuotaSignal:    enum(ps, "spec.quotaSignal", string(s.QuotaSignal), QuotaSignals[0], QuotaSignals),
		Sensing:        enum(ps, "spec.sensing", string(s.Sensing), SensingModes[0], SensingModes) == string(v1alpha1.SensingEnabled),
	}
	if !ValidTierName(o.Name) {
		ps.add("metadata.name", "%q is not an upstream name; use a DNS label: lower-case letters, digits and '-', at most 63", o.Name)
	}
	if r := s.Capacity.Rate; r < 1 || r > MaxRate {
		ps.add("spec.capacity.rate", "rate %d is out of range; use 1 to %d tokens per period", r, MaxRate)
	}
	u.Capacity.Period = duration(ps, "spec.capacity.period", s.Capacity.Period, DefaultCapacityPeriod, MinCapacityPeriod, MaxCapacityPeriod)

	switch n := len(s.Endpoints); {
	case n == 0:
		ps.add("spec.endpoints", "an upstream needs the endpoints that draw on it; list at least one EndpointQuota endpoint")
	case n > MaxUpstreamEndpoints:
		ps.add("spec.endpoints", "an upstream has at most %d endpoints, not %d", MaxUpstreamEndpoints, n)
	}
	for i, e := range s.Endpoints {
		field := fmt.Sprintf("spec.endpoints[%d]", i)
		if !ValidEndpointName(e) {
			ps.add(field, "%q is not an endpoint name; use an EndpointQuota's spec.endpoint", e)
		}
		if slices.Contains(s.Endpoints[:i], e) {
			ps.add(field, "endpoint %q is listed twice", e)
		}
	}
	u.Endpoints = slices.Compact(slices.Sorted(slices.Values(s.Endpoints)))

	if s.Probe != nil {
		u.Probe = compileProbe(s.Probe, ps)
	}
	if u.Sensing && u.Probe == nil && !u.Passive {
		ps.add("spec", "an upstream with sensing Enabled needs a signal: add a probe, set passive: true, or set sensing: Disabled")
	}
	return u, !ps.found
}

func compileProbe(in *v1alpha1.UpstreamProbe, ps *problems) *Probe {
	p := &Probe{
		URL:             in.URL,
		Method:          enum(ps, "spec.probe.method", string(in.Method), ProbeMethods[0], ProbeMethods),
		Body:            in.Body,
		Interval:        duration(ps, "spec.probe.interval", in.Interval, DefaultProbeInterval, MinProbeInterval, MaxProbeInterval),
		Timeout:         duration(ps, "spec.probe.timeout", in.Timeout, DefaultProbeTimeout, MinProbeTimeout, MaxProbeTimeout),
		RemainingHeader: DefaultRemainingHeader,
		LimitHeader:     DefaultLimitHeader,
	}
	if !ValidHTTPURL(in.URL) {
		ps.add("spec.probe.url", "url must be an absolute http or https URL with a host, such as https://api.example.com/v1/models")
	}
	if p.Timeout >= p.Interval {
		ps.add("spec.probe.timeout", "timeout %s must be shorter than interval %s: a probe ends before the next starts; shorten timeout or lengthen interval", p.Timeout, p.Interval)
	}
	if len(in.Body) > MaxProbeBodyBytes {
		ps.add("spec.probe.body", "body is %d bytes; at most %d", len(in.Body), MaxProbeBodyBytes)
	}
	if in.Body != "" && p.Method != "POST" {
		ps.add("spec.probe.body", "a body is sent only with method POST; set method: POST or remove body")
	}

	if len(in.Headers) > MaxProbeHeaders {
		ps.add("spec.probe.headers", "a probe sends at most %d headers, not %d", MaxProbeHeaders, len(in.Headers))
	}
	for i, h := range in.Headers {
		field := fmt.Sprintf("spec.probe.headers[%d]", i)
		checkHeaderName(ps, field+".name", h.Name)
		if len(h.Value) > MaxHeaderValueBytes || !headerValue.MatchString(h.Value) {
			ps.add(field+".value", "the value of %s must be at most %d printable ASCII characters, spaces or tabs", h.Name, MaxHeaderValueBytes)
		}
		if h.Value != "" && h.SecretKeyRef != nil {
			ps.add(field, "a header takes its value from value or from secretKeyRef, not both; remove one")
		}
		for _, other := range in.Headers[:i] {
			if strings.EqualFold(other.Name, h.Name) {
				ps.add(field+".name", "header %s is named twice (names are compared without case); keep one", h.Name)
				break
			}
		}
		header := Header{Name: h.Name, Value: h.Value}
		if ref := h.SecretKeyRef; ref != nil {
			checkSecretKeyRef(ps, field+".secretKeyRef", ref)
			header.SecretRef = &SecretKeyRef{Name: ref.Name, Key: ref.Key}
		}
		p.Headers = append(p.Headers, header)
	}
	slices.SortFunc(p.Headers, func(a, b Header) int { return cmp.Compare(a.Name, b.Name) })

	if len(in.ExpectedStatuses) > MaxExpectedStatuses {
		ps.add("spec.probe.expectedStatuses", "at most %d statuses, not %d", MaxExpectedStatuses, len(in.ExpectedStatuses))
	}
	for i, status := range in.ExpectedStatuses {
		field := fmt.Sprintf("spec.probe.expectedStatuses[%d]", i)
		if status < 100 || status > 599 {
			ps.add(field, "%d is not an HTTP status; use 100 to 599", status)
		}
		if slices.Contains(in.ExpectedStatuses[:i], status) {
			ps.add(field, "status %d is listed twice", status)
		}
		p.ExpectedStatuses = append(p.ExpectedStatuses, int(status))
	}
	slices.Sort(p.ExpectedStatuses)
	p.ExpectedStatuses = slices.Compact(p.ExpectedStatuses)

	if rl := in.RateLimitHeaders; rl != nil {
		if rl.Remaining != "" {
			checkHeaderName(ps, "spec.probe.rateLimitHeaders.remaining", rl.Remaining)
			p.RemainingHeader = rl.Remaining
		}
		if rl.Limit != "" {
			checkHeaderName(ps, "spec.probe.rateLimitHeaders.limit", rl.Limit)
			p.LimitHeader = rl.Limit
		}
		p.IETF = rl.IETF
	}
	return p
}

// checkWebhook checks a QuotaPlane's class-change webhook.
func checkWebhook(w *v1alpha1.OutageWebhook, ps *problems) {
	if !ValidHTTPURL(w.URL) {
		ps.add("spec.outage.webhook.url", "url must be an absolute https or http URL with a host, such as https://hooks.example.com/quotaplane")
	}
	if w.SecretRef != nil {
		checkSecretKeyRef(ps, "spec.outage.webhook.secretRef", w.SecretRef)
	}
}

func checkHeaderName(ps *problems, field, name string) {
	if len(name) > MaxHeaderNameBytes || !headerName.MatchString(name) {
		ps.add(field, "%q is not a header name; use an HTTP token of at most %d characters, such as X-Api-Key", name, MaxHeaderNameBytes)
	}
}

func checkSecretKeyRef(ps *problems, field string, ref *v1alpha1.SecretKeyReference) {
	if ref.Name == "" || len(ref.Name) > 253 {
		ps.add(field+".name", "a Secret's name is 1 to 253 characters")
	}
	if len(ref.Key) > 253 || !secretKey.MatchString(ref.Key) {
		ps.add(field+".key", "%q is not a Secret entry; use 1 to 253 letters, digits, '-', '_' or '.'", ref.Key)
	}
}

// duration returns in's duration, or def when it is unset, and reports one
// outside [lo, hi].
func duration(ps *problems, field string, in *metav1.Duration, def, lo, hi time.Duration) time.Duration {
	if in == nil {
		return def
	}
	if in.Duration < lo || in.Duration > hi {
		ps.add(field, "%s is out of range; use a duration from %s to %s (default %s)", in.Duration, lo, hi, def)
	}
	return in.Duration
}
