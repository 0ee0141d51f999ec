package client_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
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

// newEngine is an engine on the plane in fsys at fixedNow.
func newEngine(t testing.TB, fsys fs.FS) *enforcer.Engine {
	t.Helper()
	p, err := policy.LoadFS(fsys)
	if err != nil {
		t.Fatal(err)
	}
	e, err := enforcer.New(p, enforcer.WithClock(func() time.Time { return fixedNow }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// newEnforcer serves the real decision API of an engine on the plane in
// fsys on a loopback httptest server.
func newEnforcer(t testing.TB, fsys fs.FS) (*httptest.Server, *enforcer.Engine) {
	t.Helper()
	e := newEngine(t, fsys)
	srv := httptest.NewServer(server.NewAPI(e, nil))
	t.Cleanup(srv.Close)
	return srv, e
}

func newClient(t testing.TB, url string, opts ...client.Option) *client.Client {
	t.Helper()
	c, err := client.New(url, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.CloseIdleConnections)
	return c
}

// TestDecideAgreesWithTheEngine: every decision the client reads from the
// API is the one a second engine on the same plane at the same time makes,
// field by field, and the header fields are the API's.
func TestDecideAgreesWithTheEngine(t *testing.T) {
	srv, _ := newEnforcer(t, samples.FS)
	c := newClient(t, srv.URL)
	oracle := newEngine(t, samples.FS)
	requests := []enforcer.Request{
		{Tenant: "free-trial", Endpoint: "export", APIKey: "k1"},
		{Tenant: "free-trial", Endpoint: "export", APIKey: "k1"},
		{Tenant: "free-trial", Endpoint: "export", APIKey: "k1"}, // tenant level
		{Tenant: "acme", Endpoint: "write", APIKey: "acme-partner", Units: 3},
		{Tenant: "acme", Endpoint: "write", APIKey: "acme-partner", Units: 2}, // key level
		{Tenant: "acme", Endpoint: "read", APIKey: "acme-batch"},
		{Tenant: "whale-1", Endpoint: "export", APIKey: "w", Units: 11}, // endpoint level
		{Tenant: "someone-new", Endpoint: "not-in-the-plane", APIKey: "k"},
		{Tenant: "initech", Endpoint: "read", APIKey: "k1", Units: 300},
		{Tenant: "initech", Endpoint: "read", APIKey: "k2", Units: 300},
		{Tenant: "initech", Endpoint: "read", APIKey: "k3", Units: 300},
		{Tenant: "initech", Endpoint: "read", APIKey: "k4", Units: 300}, // borrows from the pool
	}
	var denials, borrowed int
	for i, r := range requests {
		header := http.Header{}
		got, err := c.Decide(context.Background(), r, header)
		if err != nil {
			t.Fatalf("request %d %+v: %v", i, r, err)
		}
		want, err := oracle.Decide(context.Background(), r)
		if err != nil {
			t.Fatal(err)
		}
		if !got.Same(&want) {
			t.Errorf("request %d %+v:\n got %+v\nwant %+v", i, r, got, want)
		}
		if header.Get("RateLimit-Policy") == "" || header.Get("RateLimit") == "" {
			t.Errorf("request %d: header %v; want RateLimit-Policy and RateLimit", i, header)
		}
		if got.Allow != (header.Get("Retry-After") == "") {
			t.Errorf("request %d: allowed %t with Retry-After %q", i, got.Allow, header.Get("Retry-After"))
		}
		if got.Borrowed > 0 {
			borrowed++
		}
		if !got.Allow {
			denials++
			if header.Get("X-Quota-Level") != string(got.Level) || header.Get("X-Quota-Reason") != got.Reason {
				t.Errorf("request %d: header %v; want level %s and reason %q", i, header, got.Level, got.Reason)
			}
		}
	}
	if denials != 3 || borrowed != 1 {
		t.Errorf("%d denials and %d borrowing; want 3 (tenant, key, endpoint) and 1", denials, borrowed)
	}
}

func TestAnswersThatAreNotDecisions(t *testing.T) {
	srv, e := newEnforcer(t, strictSamples(t))
	c := newClient(t, srv.URL)
	for _, tc := range []struct {
		name     string
		r        enforcer.Request
		sentinel error
		status   int
		message  string
	}{
		{"not a name", enforcer.Request{Tenant: "a b", Endpoint: "read", APIKey: "k"}, client.ErrBadRequest, 400, "tenant"},
		{"no api key", enforcer.Request{Tenant: "acme", Endpoint: "read"}, client.ErrBadRequest, 400, "X-Api-Key"},
		{"units", enforcer.Request{Tenant: "acme", Endpoint: "read", APIKey: "k", Units: enforcer.MaxUnits + 1}, client.ErrBadRequest, 400, "units"},
		{"unknown tenant", enforcer.Request{Tenant: "stranger", Endpoint: "read", APIKey: "k"}, client.ErrForbidden, 403, `"stranger" is not a tenant`},
		{"unknown endpoint", enforcer.Request{Tenant: "acme", Endpoint: "purge", APIKey: "k"}, client.ErrNotFound, 404, `"purge" is not an endpoint`},
		// The slash is escaped into the path segment, so the enforcer sees
		// the whole name, and refuses it as a name.
		{"endpoint name", enforcer.Request{Tenant: "acme", Endpoint: "read/../x y", APIKey: "k"}, client.ErrBadRequest, 400, "endpoint"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			header := http.Header{}
			_, err := c.Decide(context.Background(), tc.r, header)
			var se *client.StatusError
			if !errors.As(err, &se) || se.StatusCode != tc.status || !errors.Is(err, tc.sentinel) ||
				!strings.Contains(strings.ToLower(se.Message), strings.ToLower(tc.message)) {
				t.Fatalf("error %v; want a %d StatusError matching %v whose message has %q", err, tc.status, tc.sentinel, tc.message)
			}
			if len(header) != 0 {
				t.Errorf("header %v; want nothing set by an answer that is not a decision", header)
			}
			for _, other := range []error{client.ErrBadRequest, client.ErrUnauthorized, client.ErrForbidden, client.ErrNotFound, client.ErrUnavailable} {
				if other != tc.sentinel && errors.Is(err, other) {
					t.Errorf("error %v also matches %v", err, other)
				}
			}
		})
	}

	t.Run("no endpoint", func(t *testing.T) {
		_, err := c.Decide(context.Background(), enforcer.Request{Tenant: "acme", APIKey: "k"}, nil)
		if !errors.Is(err, client.ErrBadRequest) {
			t.Fatalf("error %v; want ErrBadRequest", err)
		}
	})
	t.Run("closed engine", func(t *testing.T) {
		e.Close()
		_, err := c.Decide(context.Background(), enforcer.Request{Tenant: "acme", Endpoint: "read", APIKey: "k"}, nil)
		if !errors.Is(err, client.ErrUnavailable) || !strings.Contains(err.Error(), "shutting down") {
			t.Fatalf("error %v; want ErrUnavailable saying the enforcer is shutting down", err)
		}
	})
	t.Run("no enforcer", func(t *testing.T) {
		srv.Close()
		_, err := c.Decide(context.Background(), enforcer.Request{Tenant: "acme", Endpoint: "read", APIKey: "k"}, nil)
		var se *client.StatusError
		if err == nil || errors.As(err, &se) || !strings.Contains(err.Error(), "deciding read for tenant \"acme\"") {
			t.Fatalf("error %v; want a transport error naming the request", err)
		}
	})
}

// TestKeyNotBound: on a plane that binds keys to tenants, a key that is
// not the tenant's is ErrForbidden naming level key; the tenant's own key
// is decided.
func TestKeyNotBound(t *testing.T) {
	const key = "acme-key-1"
	plane := fstest.MapFS{"plane.yaml": {Data: []byte(fmt.Sprintf(`apiVersion: quotaplane.io/v1alpha1
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
`, sha256.Sum256([]byte(key))))}}
	srv, _ := newEnforcer(t, plane)
	c := newClient(t, srv.URL)
	if d, err := c.Decide(context.Background(), enforcer.Request{Tenant: "acme", Endpoint: "read", APIKey: key}, nil); err != nil || !d.Allow {
		t.Fatalf("the tenant's own key: %+v, %v; want allowed", d, err)
	}
	_, err := c.Decide(context.Background(), enforcer.Request{Tenant: "acme", Endpoint: "read", APIKey: "not-acmes"}, nil)
	var se *client.StatusError
	if !errors.As(err, &se) || !errors.Is(err, client.ErrForbidden) || se.Level != enforcer.LevelKey || strings.Contains(se.Message, "not-acmes") {
		t.Fatalf("another key: %v (%+v); want ErrForbidden at level key that does not quote the key", err, se)
	}
}

func TestContextEndsTheDecision(t *testing.T) {
	srv, _ := newEnforcer(t, samples.FS)
	c := newClient(t, srv.URL)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := c.Decide(ctx, enforcer.Request{Tenant: "acme", Endpoint: "read", APIKey: "k"}, nil)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("error %v; want context.Canceled", err)
	}
}

// TestBearerToken: the token goes in Authorization on every decision; an
// enforcer that refuses it gives ErrUnauthorized.
func TestBearerToken(t *testing.T) {
	e := newEngine(t, samples.FS)
	api := server.NewAPI(e, nil)
	const token = "s3cret-token"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+token {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = w.Write([]byte(`{"error":"send Authorization: Bearer and the token"}` + "\n"))
			return
		}
		api.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	r := enforcer.Request{Tenant: "acme", Endpoint: "read", APIKey: "k"}

	if d, err := newClient(t, srv.URL, client.WithBearerToken(token)).Decide(context.Background(), r, nil); err != nil || !d.Allow {
		t.Fatalf("with the token: %+v, %v; want allowed", d, err)
	}
	_, err := newClient(t, srv.URL, client.WithBearerToken("wrong")).Decide(context.Background(), r, nil)
	if !errors.Is(err, client.ErrUnauthorized) || !strings.Contains(err.Error(), "send Authorization") {
		t.Fatalf("with a wrong token: %v; want ErrUnauthorized with the enforcer's message", err)
	}
	if _, err := client.New(srv.URL, client.WithBearerToken(token+"\n")); err == nil {
		t.Error("New accepted a token with a line break")
	}
}

// TestMutualTLS: with WithTLSConfig the client verifies the enforcer's
// certificate and presents its own; without a client certificate the
// handshake fails.
func TestMutualTLS(t *testing.T) {
	ca := newCA(t)
	srv := httptest.NewUnstartedServer(server.NewAPI(newEngine(t, samples.FS), nil))
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused handshakes
	srv.TLS = &tls.Config{
		Certificates: []tls.Certificate{ca.issue(t, x509.ExtKeyUsageServerAuth)},
		ClientCAs:    ca.pool,
		ClientAuth:   tls.RequireAndVerifyClientCert,
	}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	r := enforcer.Request{Tenant: "acme", Endpoint: "read", APIKey: "k"}

	c := newClient(t, srv.URL, client.WithTLSConfig(&tls.Config{
		RootCAs:      ca.pool,
		Certificates: []tls.Certificate{ca.issue(t, x509.ExtKeyUsageClientAuth)},
	}))
	if d, err := c.Decide(context.Background(), r, nil); err != nil || !d.Allow {
		t.Fatalf("with a client certificate: %+v, %v; want allowed", d, err)
	}
	c = newClient(t, srv.URL, client.WithTLSConfig(&tls.Config{RootCAs: ca.pool}))
	if _, err := c.Decide(context.Background(), r, nil); err == nil {
		t.Fatal("without a client certificate: a decision; want a handshake failure")
	}
	c = newClient(t, srv.URL)
	if _, err := c.Decide(context.Background(), r, nil); err == nil {
		t.Fatal("without the CA: a decision; want a certificate error")
	}
}

// TestConnectionsAreReused: 64 goroutines deciding 20 times each open at
// most 128 connections (about 90 measured: a connection goes back to the
// pool just after its answer is read, so a few requests dial). net/http's
// default pool keeps 2 idle per host: about 770 connections.
func TestConnectionsAreReused(t *testing.T) {
	e := newEngine(t, samples.FS)
	srv := httptest.NewUnstartedServer(server.NewAPI(e, nil))
	var opened atomic.Int64
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			opened.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	c := newClient(t, srv.URL)
	const workers, each = 64, 20
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			for range each {
				r := enforcer.Request{Tenant: "whale-1", Endpoint: "read", APIKey: "k" + string(rune('a'+w%26))}
				if _, err := c.Decide(context.Background(), r, nil); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if n := opened.Load(); n > 2*workers {
		t.Errorf("%d connections for %d decisions by %d goroutines; want at most %d", n, workers*each, workers, 2*workers)
	}
}

func TestNewRefusesBadBaseURLs(t *testing.T) {
	for _, u := range []string{"", "localhost:8080", "ftp://x", "http://", "http://x/?q=1", "://"} {
		if _, err := client.New(u); err == nil {
			t.Errorf("New(%q) accepted it", u)
		}
	}
}

// TestBaseURLWithAPath: an enforcer behind a path prefix.
func TestBaseURLWithAPath(t *testing.T) {
	mux := http.NewServeMux()
	mux.Handle("/quota/", http.StripPrefix("/quota", server.NewAPI(newEngine(t, samples.FS), nil)))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	for _, base := range []string{srv.URL + "/quota", srv.URL + "/quota/"} {
		d, err := newClient(t, base).Decide(context.Background(), enforcer.Request{Tenant: "acme", Endpoint: "read", APIKey: "k"}, nil)
		if err != nil || !d.Allow {
			t.Errorf("base %s: %+v, %v; want allowed", base, d, err)
		}
	}
}

func BenchmarkDecide(b *testing.B) {
	srv, _ := newEnforcer(b, samples.FS)
	c := newClient(b, srv.URL)
	r := enforcer.Request{Tenant: "whale-1", Endpoint: "read", APIKey: "k"}
	header := http.Header{}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := c.Decide(context.Background(), r, header); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecideParallel(b *testing.B) {
	srv, _ := newEnforcer(b, samples.FS)
	c := newClient(b, srv.URL)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		r := enforcer.Request{Tenant: "whale-1", Endpoint: "read", APIKey: "k"}
		header := http.Header{}
		for pb.Next() {
			if _, err := c.Decide(context.Background(), r, header); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// testCA issues certificates for 127.0.0.1.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pool *x509.CertPool
}

func newCA(t *testing.T) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "quotaplane test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &testCA{cert: cert, key: key, pool: pool}
}

func (ca *testCA) issue(t *testing.T, usage x509.ExtKeyUsage) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: "127.0.0.1"},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}
