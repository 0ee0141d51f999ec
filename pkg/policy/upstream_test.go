package policy_test

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/quotaplane/quotaplane/api/v1alpha1"
	"github.com/quotaplane/quotaplane/pkg/policy"
)

// newUpstream is a valid Upstream (passive reports only, the defaults) on
// endpoints. Mutators adjust it.
func newUpstream(name string, endpoints ...string) *v1alpha1.Upstream {
	return &v1alpha1.Upstream{
		TypeMeta:   metav1.TypeMeta{APIVersion: "quotaplane.io/v1alpha1", Kind: "Upstream"},
		ObjectMeta: meta(name),
		Spec: v1alpha1.UpstreamSpec{
			Capacity:  v1alpha1.Rate{Rate: 600, Period: dur(time.Minute)},
			Endpoints: endpoints,
		},
	}
}

func withProbe(u *v1alpha1.Upstream, mut func(*v1alpha1.UpstreamProbe)) *v1alpha1.Upstream {
	u.Spec.Probe = &v1alpha1.UpstreamProbe{URL: "https://api.example.com/v1/models"}
	mut(u.Spec.Probe)
	return u
}

// upstreamPlane is a plane with the endpoints upstreams refer to.
func upstreamPlane(t testing.TB) *policy.Policy {
	return mustCompile(t, newPlane(), newEndpoint("chat", "chat"), newEndpoint("embed", "embed"), newEndpoint("export", "export"))
}

func TestCompileUpstreamDefaults(t *testing.T) {
	p := upstreamPlane(t)
	got, problems := policy.CompileUpstreams(p, []*v1alpha1.Upstream{
		newUpstream("llm", "embed", "chat"),
		withProbe(newUpstream("search", "export"), func(pr *v1alpha1.UpstreamProbe) {
			pr.Method = v1alpha1.MethodPost
			pr.Body = `{"ping":true}`
			pr.Headers = []v1alpha1.HTTPHeader{
				{Name: "X-Probe", Value: "1"},
				{Name: "Authorization", SecretKeyRef: &v1alpha1.SecretKeyReference{Name: "search", Key: "token"}},
			}
			pr.Interval, pr.Timeout = dur(30*time.Second), dur(2*time.Second)
			pr.ExpectedStatuses = []int32{204, 200}
			pr.RateLimitHeaders = &v1alpha1.RateLimitHeaders{Remaining: "x-left", IETF: true}
		}),
	})
	if len(problems) > 0 {
		t.Fatalf("problems:\n%s", problemList(problems))
	}
	want := []policy.Upstream{{
		Namespace: testNS, Name: "llm",
		Capacity:  policy.Rate{Rate: 600, Period: time.Minute},
		Endpoints: []string{"chat", "embed"},
		Passive:   true, Window: 5 * time.Minute, LatencyCeiling: 5 * time.Second,
		QuotaSignal: "Remaining", Sensing: true,
	}, {
		Namespace: testNS, Name: "search",
		Capacity:  policy.Rate{Rate: 600, Period: time.Minute},
		Endpoints: []string{"export"},
		Probe: &policy.Probe{
			URL: "https://api.example.com/v1/models", Method: "POST", Body: `{"ping":true}`,
			Headers: []policy.Header{
				{Name: "Authorization", SecretRef: &policy.SecretKeyRef{Name: "search", Key: "token"}},
				{Name: "X-Probe", Value: "1"},
			},
			Interval: 30 * time.Second, Timeout: 2 * time.Second,
			ExpectedStatuses: []int{200, 204},
			RemainingHeader:  "x-left", LimitHeader: "x-ratelimit-limit-requests", IETF: true,
		},
		Passive: true, Window: 5 * time.Minute, LatencyCeiling: 5 * time.Second,
		QuotaSignal: "Remaining", Sensing: true,
	}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("compiled\n%+v\nwant\n%+v", got, want)
	}
	if r := got[0].Capacity.PerSecond(); r != 10 {
		t.Errorf("600 per minute = %v tokens/s, want 10", r)
	}
	if pr := got[1].Probe; !pr.Expects(204) || pr.Expects(201) {
		t.Error("expectedStatuses [200, 204]: want 204 expected and 201 not")
	}
	defaults := &policy.Probe{}
	if !defaults.Expects(200) || !defaults.Expects(299) || defaults.Expects(300) || defaults.Expects(199) || defaults.Expects(0) {
		t.Error("no expectedStatuses: want any 2xx and nothing else")
	}
	// A probe's own defaults.
	got, _ = policy.CompileUpstreams(p, []*v1alpha1.Upstream{withProbe(newUpstream("llm", "chat"), func(*v1alpha1.UpstreamProbe) {})})
	wantProbe := &policy.Probe{URL: "https://api.example.com/v1/models", Method: "GET", Interval: 15 * time.Second, Timeout: 5 * time.Second,
		RemainingHeader: "x-ratelimit-remaining-requests", LimitHeader: "x-ratelimit-limit-requests"}
	if len(got) != 1 || !reflect.DeepEqual(got[0].Probe, wantProbe) {
		t.Errorf("probe defaults %+v, want %+v", got, wantProbe)
	}
}

func TestCompileUpstreamProblems(t *testing.T) {
	passiveOff := false
	tests := []struct {
		name  string
		up    *v1alpha1.Upstream
		field string
		words string
	}{
		{"timeout equal to interval", withProbe(newUpstream("u", "chat"), func(pr *v1alpha1.UpstreamProbe) {
			pr.Interval, pr.Timeout = dur(5*time.Second), dur(5*time.Second)
		}), "spec.probe.timeout", "timeout 5s must be shorter than interval 5s"},
		{"default timeout above a short interval", withProbe(newUpstream("u", "chat"), func(pr *v1alpha1.UpstreamProbe) {
			pr.Interval = dur(2 * time.Second)
		}), "spec.probe.timeout", "timeout 5s must be shorter than interval 2s"},
		{"url without a scheme", withProbe(newUpstream("u", "chat"), func(pr *v1alpha1.UpstreamProbe) { pr.URL = "api.example.com/v1" }),
			"spec.probe.url", "absolute http or https URL"},
		{"url of another scheme", withProbe(newUpstream("u", "chat"), func(pr *v1alpha1.UpstreamProbe) { pr.URL = "ftp://api.example.com/" }),
			"spec.probe.url", "absolute http or https URL"},
		{"url without a host", withProbe(newUpstream("u", "chat"), func(pr *v1alpha1.UpstreamProbe) { pr.URL = "https:///v1" }),
			"spec.probe.url", "absolute http or https URL"},
		{"interval below 1s", withProbe(newUpstream("u", "chat"), func(pr *v1alpha1.UpstreamProbe) {
			pr.Interval, pr.Timeout = dur(500*time.Millisecond), dur(100*time.Millisecond)
		}), "spec.probe.interval", "500ms is out of range; use a duration from 1s to 10m0s (default 15s)"},
		{"body with GET", withProbe(newUpstream("u", "chat"), func(pr *v1alpha1.UpstreamProbe) { pr.Body = "x" }),
			"spec.probe.body", "only with method POST"},
		{"header named twice without case", withProbe(newUpstream("u", "chat"), func(pr *v1alpha1.UpstreamProbe) {
			pr.Headers = []v1alpha1.HTTPHeader{{Name: "X-Key", Value: "a"}, {Name: "x-key", Value: "b"}}
		}), "spec.probe.headers[1].name", "named twice"},
		{"header with a value and a Secret", withProbe(newUpstream("u", "chat"), func(pr *v1alpha1.UpstreamProbe) {
			pr.Headers = []v1alpha1.HTTPHeader{{Name: "X-Key", Value: "a", SecretKeyRef: &v1alpha1.SecretKeyReference{Name: "s", Key: "k"}}}
		}), "spec.probe.headers[0]", "not both"},
		{"header value with a newline", withProbe(newUpstream("u", "chat"), func(pr *v1alpha1.UpstreamProbe) {
			pr.Headers = []v1alpha1.HTTPHeader{{Name: "X-Key", Value: "a\r\nHost: evil"}}
		}), "spec.probe.headers[0].value", "printable ASCII"},
		{"expected status 600", withProbe(newUpstream("u", "chat"), func(pr *v1alpha1.UpstreamProbe) { pr.ExpectedStatuses = []int32{200, 600} }),
			"spec.probe.expectedStatuses[1]", "600 is not an HTTP status"},
		{"rate-limit header with a space", withProbe(newUpstream("u", "chat"), func(pr *v1alpha1.UpstreamProbe) {
			pr.RateLimitHeaders = &v1alpha1.RateLimitHeaders{Limit: "x limit"}
		}), "spec.probe.rateLimitHeaders.limit", "not a header name"},
		{"no endpoints", newUpstream("u"), "spec.endpoints", "needs the endpoints"},
		{"endpoint listed twice", newUpstream("u", "chat", "embed", "chat"), "spec.endpoints[2]", `endpoint "chat" is listed twice`},
		{"endpoint that is no EndpointQuota", newUpstream("u", "chat", "summarize"), "spec.endpoints[1]", `endpoint "summarize" has no valid EndpointQuota`},
		{"capacity rate 0", func() *v1alpha1.Upstream { u := newUpstream("u", "chat"); u.Spec.Capacity.Rate = 0; return u }(),
			"spec.capacity.rate", "rate 0 is out of range"},
		{"capacity period above 24h", func() *v1alpha1.Upstream {
			u := newUpstream("u", "chat")
			u.Spec.Capacity.Period = dur(25 * time.Hour)
			return u
		}(), "spec.capacity.period", "out of range"},
		{"window below 1m", func() *v1alpha1.Upstream {
			u := newUpstream("u", "chat")
			u.Spec.Window = dur(30 * time.Second)
			return u
		}(),
			"spec.window", "30s is out of range"},
		{"no signal", func() *v1alpha1.Upstream { u := newUpstream("u", "chat"); u.Spec.Passive = &passiveOff; return u }(),
			"spec", "needs a signal"},
		{"quota signal unknown", func() *v1alpha1.Upstream { u := newUpstream("u", "chat"); u.Spec.QuotaSignal = "Used"; return u }(),
			"spec.quotaSignal", `"Used" is not valid`},
		{"sensing On, which YAML reads as a boolean", func() *v1alpha1.Upstream { u := newUpstream("u", "chat"); u.Spec.Sensing = "On"; return u }(),
			"spec.sensing", "use one of Enabled, Disabled"},
		{"name not a DNS label", newUpstream("LLM", "chat"), "metadata.name", "not an upstream name"},
	}
	p := upstreamPlane(t)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, problems := policy.CompileUpstreams(p, []*v1alpha1.Upstream{tt.up})
			expectProblem(t, problems, "Upstream", tt.field, tt.words)
			if len(got) != 0 {
				t.Errorf("compiled %+v, want it left out", got)
			}
		})
	}
	// No signal is fine when sensing is Disabled.
	u := newUpstream("static", "chat")
	u.Spec.Passive, u.Spec.Sensing = &passiveOff, v1alpha1.SensingDisabled
	if got, problems := policy.CompileUpstreams(p, []*v1alpha1.Upstream{u}); len(problems) > 0 || len(got) != 1 || got[0].Sensing || got[0].Passive {
		t.Errorf("sensing Disabled without a signal: %+v, problems:\n%s", got, problemList(problems))
	}
}

func TestCompileUpstreamsAcrossObjects(t *testing.T) {
	p := upstreamPlane(t)
	t.Run("an endpoint draws on one upstream", func(t *testing.T) {
		// b is invalid, so it claims nothing: c keeps embed; a, first by name, keeps chat.
		got, problems := policy.CompileUpstreams(p, []*v1alpha1.Upstream{
			newUpstream("c", "embed", "chat"), newUpstream("a", "chat"), newUpstream("b", "embed", "nowhere"),
		})
		if names := upstreamNames(got); !reflect.DeepEqual(names, []string{"a"}) {
			t.Errorf("valid upstreams %v, want [a]", names)
		}
		var lines []string
		for _, pr := range problems {
			lines = append(lines, pr.String())
		}
		want := []string{
			`Upstream quota/b: spec.endpoints[1]: endpoint "nowhere" has no valid EndpointQuota in this plane; create one or remove it from endpoints`,
			`Upstream quota/c: spec.endpoints[1]: endpoint "chat" already draws on Upstream a; an endpoint draws on one upstream: remove it from one of them`,
		}
		if !reflect.DeepEqual(lines, want) {
			t.Errorf("problems\n%s\nwant\n%s", strings.Join(lines, "\n"), strings.Join(want, "\n"))
		}
	})
	t.Run("at most 16 per plane", func(t *testing.T) {
		var eps []runtime.Object
		var ups []*v1alpha1.Upstream
		for i := range policy.MaxUpstreams + 2 {
			ep := fmt.Sprintf("ep-%02d", i)
			eps = append(eps, newEndpoint(ep, ep))
			ups = append(ups, newUpstream(fmt.Sprintf("u-%02d", policy.MaxUpstreams+1-i), ep)) // reverse name order
		}
		p := mustCompile(t, append(eps, newPlane())...)
		got, problems := policy.CompileUpstreams(p, ups)
		if len(got) != policy.MaxUpstreams || got[0].Name != "u-00" || got[policy.MaxUpstreams-1].Name != "u-15" {
			t.Errorf("kept %v, want u-00 to u-15", upstreamNames(got))
		}
		if len(problems) != 2 || problems[0].Name != "u-16" || problems[1].Name != "u-17" ||
			!strings.Contains(problems[0].Message, "the plane already has 16 Upstreams (u-00, …, u-15); a plane has at most 16") {
			t.Errorf("problems:\n%s", problemList(problems))
		}
	})
	t.Run("another namespace", func(t *testing.T) {
		u := newUpstream("llm", "chat")
		u.Namespace = "other"
		_, problems := policy.CompileUpstreams(p, []*v1alpha1.Upstream{u})
		expectProblem(t, problems, "Upstream", "metadata.namespace", `object is in namespace "other"`)
	})
	t.Run("without a policy, only the objects' own fields", func(t *testing.T) {
		got, problems := policy.CompileUpstreams(nil, []*v1alpha1.Upstream{newUpstream("llm", "anything")})
		if len(problems) > 0 || len(got) != 1 {
			t.Errorf("%+v, problems:\n%s", got, problemList(problems))
		}
	})
}

// TestCompileReportsUpstreamsWithoutCompilingThem: Compile checks the
// Upstreams among its objects (the check command, file mode, LoadDir) and
// reports their problems, but they are not the policy's content.
func TestCompileReportsUpstreamsWithoutCompilingThem(t *testing.T) {
	base := mustCompile(t, newPlane(), newEndpoint("chat", "chat"))
	p := mustCompile(t, newPlane(), newEndpoint("chat", "chat"), newUpstream("llm", "chat"))
	if p.Hash() != base.Hash() {
		t.Errorf("an Upstream changed the policy's hash: %s, want %s", p.Hash(), base.Hash())
	}
	p, problems := policy.Compile(objects(newPlane(), newEndpoint("chat", "chat"), newUpstream("llm", "chat", "chat")))
	if p == nil || p.Hash() != base.Hash() {
		t.Errorf("an invalid Upstream changed the policy: %v", p)
	}
	expectProblem(t, problems, "Upstream", "spec.endpoints[1]", "listed twice")
	// Two of one name, as files may hold: both left out, as for every kind.
	_, problems = policy.Compile(objects(newPlane(), newEndpoint("chat", "chat"), newUpstream("llm", "chat"), newUpstream("llm", "chat")))
	if len(problems) != 2 || problems[0].Kind != "Upstream" || !strings.Contains(problems[0].Message, "defined 2 times") {
		t.Errorf("problems:\n%s", problemList(problems))
	}
}

func TestOutageWebhook(t *testing.T) {
	base := mustCompile(t, newPlane())
	p := mustCompile(t, newPlane(func(qp *v1alpha1.QuotaPlane) {
		qp.Spec.Outage = &v1alpha1.Outage{Webhook: &v1alpha1.OutageWebhook{
			URL:       "https://hooks.example.com/quotaplane",
			SecretRef: &v1alpha1.SecretKeyReference{Name: "hooks", Key: "hmac"},
		}}
	}))
	if p.Hash() != base.Hash() {
		t.Error("the webhook changed the policy's hash; the leader reads it from the QuotaPlane")
	}
	p, problems := policy.Compile(objects(newPlane(func(qp *v1alpha1.QuotaPlane) {
		qp.Spec.Outage = &v1alpha1.Outage{Webhook: &v1alpha1.OutageWebhook{URL: "hooks.example.com"}}
	})))
	if p != nil {
		t.Error("a plane with a bad webhook url compiled")
	}
	expectProblem(t, problems, "QuotaPlane", "spec.outage.webhook.url", "absolute https or http URL")
}

func TestValidHTTPURL(t *testing.T) {
	for s, want := range map[string]bool{
		"https://api.openai.com/v1/models": true,
		"http://10.0.0.7:8080/healthz":     true,
		"https://[::1]:8443/":              true,
		"HTTPS://EXAMPLE.COM":              true,
		"https://example.com/p?q=1#frag":   true,
		"":                                 false,
		"example.com":                      false,
		"/v1/models":                       false,
		"ftp://example.com/":               false,
		"https:///v1":                      false,
		"https://exa mple.com/":            false,
		"https://example.com/" + strings.Repeat("a", policy.MaxURLBytes): false,
	} {
		if got := policy.ValidHTTPURL(s); got != want {
			t.Errorf("ValidHTTPURL(%q) = %t, want %t", s, got, want)
		}
	}
}

// TestSampleUpstream: config/samples/upstream holds Upstreams of the sample
// plane (kept beside it until the manager reconciles Upstreams), and they
// compile against it.
func TestSampleUpstream(t *testing.T) {
	p, err := policy.LoadDir(samplesDir)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := policy.ReadDir(samplesDir + "/upstream")
	if err != nil {
		t.Fatal(err)
	}
	var ups []*v1alpha1.Upstream
	for _, o := range objs {
		ups = append(ups, o.(*v1alpha1.Upstream))
	}
	got, problems := policy.CompileUpstreams(p, ups)
	if len(problems) > 0 || len(got) != 1 {
		t.Fatalf("%+v, problems:\n%s", got, problemList(problems))
	}
	if llm := got[0]; llm.Name != "llm" || llm.Capacity.PerSecond() != 100 || !reflect.DeepEqual(llm.Endpoints, []string{"export"}) || !llm.Passive || !llm.Sensing {
		t.Errorf("the sample upstream = %+v; want llm, 100 tokens/s on export, passive, sensing", llm)
	}
	// And the sample tenants' priority signals.
	whale, _ := p.Tenant("whale-1")
	acme, _ := p.Tenant("acme")
	if whale.Priority == nil || *whale.Priority != (policy.Priority{ContractValue: 1_200_000, Realtime: true, Importance: 80}) ||
		acme.Priority == nil || *acme.Priority != (policy.Priority{ContractValue: 90_000, Importance: 40}) {
		t.Errorf("sample priorities: whale-1 %+v, acme %+v", whale.Priority, acme.Priority)
	}
	if p.PriorityBase("enterprise") != 0.7 || p.PriorityBase("standard") != 0.4 || p.PriorityBase("free") != 0.1 {
		t.Errorf("sample tier bases %v %v %v, want 0.7 0.4 0.1", p.PriorityBase("enterprise"), p.PriorityBase("standard"), p.PriorityBase("free"))
	}
}

func upstreamNames(ups []policy.Upstream) []string {
	names := []string{}
	for _, u := range ups {
		names = append(names, u.Name)
	}
	return names
}
