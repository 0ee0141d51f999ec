package middleware_test

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"testing/fstest"
	"time"

	"github.com/quotaplane/quotaplane/config/samples"
	"github.com/quotaplane/quotaplane/pkg/client"
	"github.com/quotaplane/quotaplane/pkg/enforcer"
	"github.com/quotaplane/quotaplane/pkg/policy"
	"github.com/quotaplane/quotaplane/pkg/server"
)

// fixedNow is the time every engine in these tests decides at: buckets
// never refill, so answers are exact.
var fixedNow = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// quotaFields are the response header fields of a decision.
var quotaFields = []string{"RateLimit-Policy", "RateLimit", "Retry-After", "X-Quota-Level", "X-Quota-Reason"}

// strictSamples is the sample plane that denies tenants and endpoints it
// does not name.
func strictSamples(t testing.TB) fs.FS {
	t.Helper()
	plane, err := fs.ReadFile(samples.FS, "quotaplane.yaml")
	if err != nil {
		t.Fatal(err)
	}
	strict := strings.NewReplacer("unknownTenants: default", "unknownTenants: deny",
		"unknownEndpoints: default", "unknownEndpoints: deny").Replace(string(plane))
	if strict == string(plane) {
		t.Fatal("the sample plane no longer says unknownTenants: default and unknownEndpoints: default")
	}
	m := fstest.MapFS{"quotaplane.yaml": {Data: []byte(strict)}}
	for _, name := range []string{"burstpool.yaml", "endpoints.yaml", "tenants.yaml"} {
		data, err := fs.ReadFile(samples.FS, name)
		if err != nil {
			t.Fatal(err)
		}
		m[name] = &fstest.MapFile{Data: data}
	}
	return m
}

// newEngine is an engine on the plane in fsys, at fixedNow unless opts
// say otherwise.
func newEngine(t testing.TB, fsys fs.FS, opts ...enforcer.Option) *enforcer.Engine {
	t.Helper()
	p, err := policy.LoadFS(fsys)
	if err != nil {
		t.Fatal(err)
	}
	opts = append([]enforcer.Option{enforcer.WithClock(func() time.Time { return fixedNow })}, opts...)
	e, err := enforcer.New(p, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// remote is a client of a real decision API server over engine e.
func remote(t testing.TB, e *enforcer.Engine) (*client.Client, *httptest.Server) {
	t.Helper()
	srv := httptest.NewServer(server.NewAPI(e, nil))
	t.Cleanup(srv.Close)
	c, err := client.New(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.CloseIdleConnections)
	return c, srv
}

// identifyByHeaders is how the tests' services name a request: tenant and
// key from X-Tenant and X-Api-Key (as an authenticating proxy would set
// them), the endpoint from the path's last segment, units from X-Quota-Units.
func identifyByHeaders(r *http.Request) (enforcer.Request, error) {
	req := enforcer.Request{
		Tenant:   r.Header.Get("X-Tenant"),
		APIKey:   r.Header.Get("X-Api-Key"),
		Endpoint: r.URL.Path[strings.LastIndexByte(r.URL.Path, '/')+1:],
	}
	if req.Tenant == "" {
		return req, errors.New("no X-Tenant: say which tenant this request is for")
	}
	if v := r.Header.Get("X-Quota-Units"); v != "" {
		units, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return req, errors.New("X-Quota-Units is not a number")
		}
		req.Units = units
	}
	return req, nil
}

// app is the service behind the middleware: it counts the requests it
// serves.
type app struct{ served atomic.Int64 }

func (a *app) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	a.served.Add(1)
	w.Header().Set("Content-Type", "text/plain")
	_, _ = w.Write([]byte("served\n"))
}

func request(path, tenant, key string) *http.Request {
	r := httptest.NewRequest(http.MethodPost, path, nil)
	if tenant != "" {
		r.Header.Set("X-Tenant", tenant)
	}
	if key != "" {
		r.Header.Set("X-Api-Key", key)
	}
	return r
}

// boundKey is the one api key of tenant acme on boundPlane.
const boundKey = "acme-key-1"

// boundPlane binds api keys to tenants: acme's only key is boundKey.
func boundPlane(t testing.TB) fs.FS {
	t.Helper()
	return fstest.MapFS{"plane.yaml": {Data: []byte(fmt.Sprintf(`apiVersion: quotaplane.io/v1alpha1
kind: QuotaPlane
metadata:
  name: bound
spec:
  global: {rate: 1000, burst: 1000}
  keyBinding: bound
  defaultTier: standard
  tiers:
    - name: standard
      tenant: {rate: 100, burst: 100}
---
apiVersion: quotaplane.io/v1alpha1
kind: TenantQuota
metadata:
  name: acme
spec:
  tenant: acme
  tier: standard
  keyHashes: ["sha256:%x"]
`, sha256.Sum256([]byte(boundKey))))}}
}
