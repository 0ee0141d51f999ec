package policy_test

import (
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/quotaplane/quotaplane/api/v1alpha1"
	"github.com/quotaplane/quotaplane/pkg/policy"
)

func match(typ v1alpha1.PathMatchType, value string, methods ...string) v1alpha1.EndpointMatch {
	return v1alpha1.EndpointMatch{Path: v1alpha1.PathMatch{Type: typ, Value: value}, Methods: methods}
}

func withMatch(ms ...v1alpha1.EndpointMatch) func(*v1alpha1.EndpointQuota) {
	return func(e *v1alpha1.EndpointQuota) { e.Spec.Match = ms }
}

// TestMatchEndpointOrder checks the stated order: Exact before Pattern
// before PathPrefix, then the longer value, then a match with methods
// before one without, then the endpoint name — whatever order the objects
// and their matches come in.
func TestMatchEndpointOrder(t *testing.T) {
	p := mustCompile(t, newPlane(),
		newEndpoint("catch-all", "default", withMatch(match(v1alpha1.PathPrefix, "/"))),
		newEndpoint("v1", "v1", withMatch(match(v1alpha1.PathPrefix, "/v1"))),
		newEndpoint("export", "export", withMatch(match(v1alpha1.PathPrefix, "/v1/export", "POST"))),
		newEndpoint("export-any", "export-any", withMatch(match(v1alpha1.PathPrefix, "/v1/export"))),
		newEndpoint("generate", "generate", withMatch(match(v1alpha1.PathPattern, "/v1/models/*/generate"))),
		newEndpoint("health", "health", withMatch(match(v1alpha1.PathExact, "/v1/models/health/generate"))),
		newEndpoint("models", "models", withMatch(match(v1alpha1.PathPrefix, "/v1/models/", "GET"))),
	)
	for _, tt := range []struct{ method, path, want string }{
		{"POST", "/v1/export", "export"},
		{"POST", "/v1/export/7", "export"},
		{"GET", "/v1/export/7", "export-any"}, // methods narrow the match
		{"POST", "/v1/exports", "v1"},         // prefixes are segment-aware
		{"POST", "/v1/models/gpt/generate", "generate"},
		{"POST", "/v1/models/health/generate", "health"}, // exact beats a pattern
		{"POST", "/v1/models//generate", "v1"},           // '*' takes a non-empty segment
		{"POST", "/v1/models/a/b/generate", "v1"},        // and exactly one
		{"GET", "/v1/models/gpt", "models"},
		{"HEAD", "/v1/models/gpt", "models"},              // HEAD is served as GET
		{"POST", "/v1/models/gpt/generate/", "generate"},  // a trailing '/' does not dodge a Pattern
		{"POST", "/v1/models/health/generate/", "health"}, // nor an Exact
		{"GET", "/v1/models/", "models"},
		{"GET", "/v1/models", "v1"}, // "/v1/models/" takes what is below it
		{"GET", "/", "default"},
		{"DELETE", "/elsewhere", "default"},
	} {
		got, ok := p.MatchEndpoint(tt.method, tt.path)
		if !ok || got != tt.want {
			t.Errorf("MatchEndpoint(%s %s) = %q, %t; want %q", tt.method, tt.path, got, ok, tt.want)
		}
	}

	// Without a catch-all, a request no match takes has no endpoint.
	p = mustCompile(t, newPlane(), newEndpoint("export", "export", withMatch(match(v1alpha1.PathPrefix, "/v1/export"))))
	if got, ok := p.MatchEndpoint("GET", "/v2"); ok {
		t.Errorf("MatchEndpoint(GET /v2) = %q; want no match", got)
	}
}

func TestCanonicalPath(t *testing.T) {
	for _, tt := range []struct{ in, want, err string }{
		{in: "/v1/export", want: "/v1/export"},
		{in: "/v1/export?x=1#f", want: "/v1/export"},
		{in: "/v1//export/./", want: "/v1/export/"},
		{in: "/v1/a/../export", want: "/v1/export"},
		{in: "/../../v1/export", want: "/v1/export"},
		{in: "/v1/%65xport", want: "/v1/export"}, // decoded as the upstream reads it
		{in: "/v1/a%2Fb", err: "encodes a '/'"},  // upstreams disagree on whether it separates
		{in: "/v1/a%5cb", err: "encodes a '/' or '\\'"},
		{in: "/v1\\export", err: "backslash"},
		{in: "/v1/render,pd%66", want: "/v1/render,pdf"}, // one spelling for what needs no encoding
		{in: "/v1/a%20b%3F", want: "/v1/a%20b%3F"},       // what needs it stays encoded
		{in: "/v1/%2e%2e/export", want: "/export"},       // an encoded dot-dot is a dot-dot (RFC 3986 6.2.2.2)
		{in: "/", want: "/"},
		{in: "v1/export", err: "does not start with '/'"},
		{in: "/v1/%zz", err: "bad percent-encoding"},
		{in: "/v1/ex port", err: "control, space or non-ASCII"},
		{in: "/v1/\x00", err: "control, space or non-ASCII"},
		{in: "/" + strings.Repeat("a", policy.MaxPathBytes), err: "longer than"},
	} {
		got, err := policy.CanonicalPath(tt.in)
		switch {
		case tt.err != "" && (err == nil || !strings.Contains(err.Error(), tt.err)):
			t.Errorf("CanonicalPath(%q) = %q, %v; want an error with %q", tt.in, got, err, tt.err)
		case tt.err == "" && (err != nil || got != tt.want):
			t.Errorf("CanonicalPath(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
		}
	}
}

func TestMatchProblems(t *testing.T) {
	for _, tt := range []struct {
		name  string
		m     v1alpha1.EndpointMatch
		field string
		want  string
	}{
		{"relative path", match(v1alpha1.PathPrefix, "v1"), "spec.match[0].path.value", "absolute URL path"},
		{"dot-dot", match(v1alpha1.PathPrefix, "/v1/../x"), "spec.match[0].path.value", "'..'"},
		{"not canonical", match(v1alpha1.PathExact, "/v1/%65xport"), "spec.match[0].path.value", `write it as "/v1/export"`},
		{"pattern without star", match(v1alpha1.PathPattern, "/v1/x"), "spec.match[0].path.value", "exactly '*'"},
		{"unknown type", match("Regex", "/v1"), "spec.match[0].path.type", "Exact, PathPrefix or Pattern"},
		{"unknown method", match(v1alpha1.PathPrefix, "/v1", "FETCH"), "spec.match[0].methods", "not an HTTP method"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p, problems := policy.Compile(objects(newPlane(), newEndpoint("e", "e", withMatch(tt.m))))
			if len(problems) != 1 || problems[0].Field != tt.field || !strings.Contains(problems[0].Message, tt.want) {
				t.Fatalf("problems %s; want one at %s saying %q", problemList(problems), tt.field, tt.want)
			}
			if _, ok := p.EndpointIndex("e"); ok {
				t.Error("an endpoint with a bad match is in the policy")
			}
		})
	}
}

func TestResolveEndpoint(t *testing.T) {
	p := mustCompile(t, newPlane(), newEndpoint("export", "export"), newEndpoint("read", "Read"))
	for _, tt := range []struct {
		name string
		want string
		ok   bool
	}{
		{"export", "export", true}, {"Export", "export", true}, {"EXPORT", "export", true},
		{"read", "Read", true}, {"Read", "Read", true},
		{"export ", "", false}, {"exports", "", false}, {strings.Repeat("e", 300), "", false},
	} {
		i, ok := p.ResolveEndpoint(tt.name)
		if ok != tt.ok || ok && p.Endpoints()[i].Name != tt.want {
			t.Errorf("ResolveEndpoint(%q) = %d, %t; want %q, %t", tt.name, i, ok, tt.want, tt.ok)
		}
	}
	if n := testing.AllocsPerRun(100, func() { p.ResolveEndpoint("EXPORT") }); n != 0 {
		t.Errorf("ResolveEndpoint allocates %v times", n)
	}

	// Two endpoints that differ only in case: the second is refused.
	_, problems := policy.Compile(objects(newPlane(), newEndpoint("a", "export"), newEndpoint("b", "Export")))
	if len(problems) != 1 || problems[0].Name != "a" || !strings.Contains(problems[0].Message, "only in case") {
		t.Errorf("problems %s; want one on EndpointQuota a (Export sorts first) saying the names differ only in case", problemList(problems))
	}
}

func TestKeyBinding(t *testing.T) {
	secret := &corev1.Secret{ObjectMeta: meta("acme-keys"), Data: map[string][]byte{
		"ci":     []byte("acme-ci-key\r\n"),
		"hashed": []byte(policy.HashKey("acme-hashed-key")),
	}}
	p := mustCompile(t, newPlane(func(q *v1alpha1.QuotaPlane) { q.Spec.KeyBinding = v1alpha1.KeyBindingBound }),
		newTenant("acme", "acme", "gold", func(tq *v1alpha1.TenantQuota) {
			tq.Spec.KeyHashes = []string{policy.HashKey("acme-key")}
			tq.Spec.KeySecretRef = &v1alpha1.SecretReference{Name: "acme-keys"}
		}),
		newTenant("initech", "initech", "gold", func(tq *v1alpha1.TenantQuota) {
			tq.Spec.KeyHashes = []string{policy.HashKey("initech-key")}
		}),
		secret,
	)
	if p.KeyBinding() != policy.KeyBindingBound {
		t.Fatalf("KeyBinding() = %q", p.KeyBinding())
	}
	for _, tt := range []struct {
		tenant, key string
		want        bool
	}{
		{"acme", "acme-key", true}, {"acme", "acme-ci-key", true}, {"acme", "acme-hashed-key", true},
		{"acme", "initech-key", false}, {"initech", "acme-key", false}, {"initech", "initech-key", true},
		{"acme", "", false}, {"acme", "acme-ci-key\r\n", false}, {"hooli", "acme-key", false},
		{"acme", strings.Repeat("k", 300), false},
	} {
		if got := p.KeyBelongs(tt.tenant, tt.key); got != tt.want {
			t.Errorf("KeyBelongs(%q, %q) = %t; want %t", tt.tenant, tt.key, got, tt.want)
		}
	}
	if strings.Contains(string(p.Encode()), "acme-ci-key") {
		t.Error("the encoded policy holds a raw key from the Secret")
	}
	long := strings.Repeat("k", policy.MaxNameBytes)
	if n := testing.AllocsPerRun(100, func() { p.KeyBelongs("acme", long) }); n != 0 {
		t.Errorf("KeyBelongs allocates %v times", n)
	}

	// Round trip: the hashes survive Encode and Decode.
	q, err := policy.Decode(p.Encode())
	if err != nil || !q.KeyBelongs("acme", "acme-ci-key") {
		t.Fatalf("decoded policy: %v; acme-ci-key belongs to acme: %t", err, err == nil && q.KeyBelongs("acme", "acme-ci-key"))
	}
}

func TestKeyProblems(t *testing.T) {
	plane := newPlane()
	for _, tt := range []struct {
		name    string
		objs    []func(*v1alpha1.TenantQuota)
		secrets []*corev1.Secret
		want    string
	}{
		{name: "bad hash", objs: []func(*v1alpha1.TenantQuota){func(tq *v1alpha1.TenantQuota) { tq.Spec.KeyHashes = []string{"sha256:abc"} }},
			want: "is not a key hash"},
		{name: "missing Secret", objs: []func(*v1alpha1.TenantQuota){func(tq *v1alpha1.TenantQuota) {
			tq.Spec.KeySecretRef = &v1alpha1.SecretReference{Name: "nope"}
		}}, want: `Secret "nope" is not in namespace quota`},
		{name: "Secret value with a space", objs: []func(*v1alpha1.TenantQuota){func(tq *v1alpha1.TenantQuota) {
			tq.Spec.KeySecretRef = &v1alpha1.SecretReference{Name: "s"}
		}}, secrets: []*corev1.Secret{{ObjectMeta: meta("s"), Data: map[string][]byte{"k": []byte("not a key")}}},
			want: `entry "k" is neither an api key`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			objs := objects(plane, newTenant("t", "t", "gold", tt.objs...))
			for _, s := range tt.secrets {
				objs = append(objs, s)
			}
			p, problems := policy.Compile(objs)
			if len(problems) != 1 || !strings.Contains(problems[0].Message, tt.want) {
				t.Fatalf("problems %s; want one saying %q", problemList(problems), tt.want)
			}
			if strings.Contains(problems[0].Message, "not a key\"") {
				t.Error("a problem quotes a Secret's value")
			}
			if _, ok := p.Tenant("t"); ok {
				t.Error("the tenant with the problem is in the policy")
			}
		})
	}

	// A key belongs to one tenant: the second tenant to claim it is left out.
	shared := func(tq *v1alpha1.TenantQuota) { tq.Spec.KeyHashes = []string{policy.HashKey("shared")} }
	p, problems := policy.Compile(objects(plane, newTenant("a", "a", "gold", shared), newTenant("b", "b", "gold", shared)))
	if len(problems) != 1 || problems[0].Name != "b" || !strings.Contains(problems[0].Message, `also a key of tenant "a"`) {
		t.Fatalf("problems %s; want one on b naming tenant a", problemList(problems))
	}
	if !p.KeyBelongs("a", "shared") {
		t.Error("the first tenant lost its key")
	}
}

func TestDescriptorMapping(t *testing.T) {
	p := mustCompile(t, newPlane())
	if d := p.Descriptors(); !slices.Equal(d.Tenant, []string{"tenant"}) || !slices.Equal(d.Endpoint, []string{"endpoint"}) || !slices.Equal(d.APIKey, []string{"api_key"}) {
		t.Errorf("default descriptors %+v", *d)
	}
	p = mustCompile(t, newPlane(func(q *v1alpha1.QuotaPlane) {
		q.Spec.Descriptors = &v1alpha1.DescriptorMapping{Tenant: []string{"x-tenant-id", "tenant"}, Endpoint: []string{"generic_key"}}
	}))
	if d := p.Descriptors(); !slices.Equal(d.Tenant, []string{"x-tenant-id", "tenant"}) || !slices.Equal(d.Endpoint, []string{"generic_key"}) || !slices.Equal(d.APIKey, []string{"api_key"}) {
		t.Errorf("descriptors %+v", *d)
	}
	_, problems := policy.Compile(objects(newPlane(func(q *v1alpha1.QuotaPlane) {
		q.Spec.Descriptors = &v1alpha1.DescriptorMapping{Endpoint: []string{"tenant"}}
	})))
	if len(problems) != 1 || problems[0].Field != "spec.descriptors.endpoint" || !strings.Contains(problems[0].Message, `"tenant" also names the tenant`) {
		t.Errorf("problems %s; want one saying the entry key names two things", problemList(problems))
	}
}

func TestLoadSecretFromFiles(t *testing.T) {
	objs, err := policy.DecodeYAML([]byte(`apiVersion: v1
kind: Secret
metadata: {name: acme-keys}
stringData: {ci: acme-ci-key}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: ignored}
`))
	if err != nil || len(objs) != 1 {
		t.Fatalf("DecodeYAML: %d objects, %v; want the Secret alone", len(objs), err)
	}
	s, ok := objs[0].(*corev1.Secret)
	if !ok || s.Namespace != policy.DefaultNamespace || string(s.Data["ci"]) != "acme-ci-key" {
		t.Fatalf("decoded %#v", objs[0])
	}
}

// FuzzCanonicalPath: a canonical path is canonical again, absolute, free of
// empty, '.' and '..' segments, and matching it never panics.
func FuzzCanonicalPath(f *testing.F) {
	p := mustCompile(f, newPlane(),
		newEndpoint("g", "g", withMatch(match(v1alpha1.PathPattern, "/v1/*/g/"))),
		newEndpoint("x", "x", withMatch(match(v1alpha1.PathPrefix, "/v1/x/"), match(v1alpha1.PathExact, "/v1"))))
	for _, s := range []string{"/", "/v1/%2e%2e/x", "/v1//a/./g/", "/v1/a%2Fb/g/", "/v1/x/?q", "x", "/%"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, uri string) {
		c, err := policy.CanonicalPath(uri)
		if err != nil {
			return
		}
		again, err := policy.CanonicalPath(c)
		if err != nil || again != c {
			t.Fatalf("CanonicalPath(%q) = %q, but CanonicalPath(%q) = %q, %v", uri, c, c, again, err)
		}
		if !strings.HasPrefix(c, "/") || strings.Contains(c, "//") || strings.Contains(c, "/../") || strings.HasSuffix(c, "/..") || strings.Contains(c, "/./") {
			t.Fatalf("CanonicalPath(%q) = %q is not canonical", uri, c)
		}
		p.MatchEndpoint("GET", c)
	})
}
