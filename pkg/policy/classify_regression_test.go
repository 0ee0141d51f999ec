package policy

import "testing"

func classifyPlane(t *testing.T) *Policy {
	t.Helper()
	objs, err := DecodeYAML([]byte(`apiVersion: quotaplane.io/v1alpha1
kind: QuotaPlane
metadata:
  name: main
spec:
  global: {rate: 1000, burst: 1000}
  defaultTier: free
  tiers:
    - name: free
      tenant: {rate: 100, burst: 100}
---
apiVersion: quotaplane.io/v1alpha1
kind: EndpointQuota
metadata:
  name: export
spec:
  endpoint: export
  cost: 50
  match:
    - path: {type: Pattern, value: /v1/reports/*/export}
      methods: [POST]
    - path: {type: Exact, value: "/v1/render,pdf"}
---
apiVersion: quotaplane.io/v1alpha1
kind: EndpointQuota
metadata:
  name: read
spec:
  endpoint: read
  match:
    - path: {type: PathPrefix, value: /}
`))
	if err != nil {
		t.Fatal(err)
	}
	p, problems := Compile(objs)
	if len(problems) > 0 {
		t.Fatal(problems)
	}
	return p
}

// TestEncodedSubDelimKeepsItsMatch: CanonicalPath left a segment without
// '%' as it was but re-escaped one with '%' by url.PathEscape, which
// escapes , ; ! ' ( ) *: percent-encoding any other character of
// /v1/render,pdf (render,pd%66) made it /v1/render%2Cpdf, which no match
// took, while the upstream (Go's r.URL.Path, nginx's $uri) reads
// /v1/render,pdf. Found in review.
func TestEncodedSubDelimKeepsItsMatch(t *testing.T) {
	p := classifyPlane(t)
	for _, uri := range []string{"/v1/render,pdf", "/v1/render,pd%66", "/v1/%72ender,pdf"} {
		c, err := CanonicalPath(uri)
		if err != nil {
			t.Fatal(err)
		}
		if ep, _ := p.MatchEndpoint("GET", c); ep != "export" {
			t.Errorf("%s: canonical %s classifies as %q; want export", uri, c, ep)
		}
	}
}

// TestEncodedSlashRefused: %2F stayed inside its segment, so
// POST /v1/reports%2F7%2Fexport was not the export Pattern (cost 50) but
// the catch-all (cost 1), while upstreams that decode %2F before routing
// (WSGI/ASGI PATH_INFO: Flask, Django, FastAPI/Starlette; nginx's $uri when
// it proxies with a URI part) serve it as /v1/reports/7/export. It is now
// refused. Found in review.
func TestEncodedSlashRefused(t *testing.T) {
	p := classifyPlane(t)
	c, err := CanonicalPath("/v1/reports%2F7%2Fexport")
	if err != nil {
		return // refused: the fix
	}
	if ep, _ := p.MatchEndpoint("POST", c); ep != "export" {
		t.Errorf("canonical %s classifies as %q; want export or a 400", c, ep)
	}
}

// TestTrailingSlashKeepsItsMatch: with the trailing '/' a Pattern (or
// Exact) failed to match, so POST /v1/reports/7/export/ fell to the
// cheaper catch-all. Found in review. Express (strict routing off, its
// default), Rails, Spring MVC before 6 and FastAPI (redirect_slashes)
// serve it as the export route.
func TestTrailingSlashKeepsItsMatch(t *testing.T) {
	p := classifyPlane(t)
	c, err := CanonicalPath("/v1/reports/7/export/")
	if err != nil {
		t.Fatal(err)
	}
	if ep, _ := p.MatchEndpoint("POST", c); ep != "export" {
		t.Errorf("canonical %s classifies as %q; want export", c, ep)
	}
}
