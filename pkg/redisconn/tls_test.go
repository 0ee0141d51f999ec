package redisconn_test

import (
	"context"
	"crypto/tls"
	"strings"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/pkg/authn/authntest"
	"github.com/quotaplane/quotaplane/pkg/enforcer"
	"github.com/quotaplane/quotaplane/pkg/keyspace"
	"github.com/quotaplane/quotaplane/pkg/policy"
	"github.com/quotaplane/quotaplane/pkg/redistest"
)

// tlsRedis is a Redis that speaks only TLS, with a certificate of its own
// CA for 127.0.0.1 and localhost; with authClients it requires a client
// certificate of that CA. It returns the server and the files a client
// needs: the CA, and a client certificate and key.
func tlsRedis(t *testing.T, authClients bool) (srv *redistest.Server, caFile, certFile, keyFile string) {
	t.Helper()
	dir := t.TempDir()
	ca := authntest.NewCA(t, "redis-ca")
	serverCert, serverKey := ca.Server(t, "redis")
	clientCert, clientKey := ca.ClientPEM(t, "quotaplane-enforcer")
	caFile = authntest.Write(t, dir, "ca.crt", ca.PEM)
	certFile = authntest.Write(t, dir, "client.crt", clientCert)
	keyFile = authntest.Write(t, dir, "client.key", clientKey)
	pair, err := tls.X509KeyPair(clientCert, clientKey)
	if err != nil {
		t.Fatal(err)
	}
	srv = redistest.StartTLS(t, redistest.TLS{
		CertFile:    authntest.Write(t, dir, "server.crt", serverCert),
		KeyFile:     authntest.Write(t, dir, "server.key", serverKey),
		CAFile:      caFile,
		AuthClients: authClients,
		Client:      &tls.Config{RootCAs: ca.Pool(), Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12},
	})
	return srv, caFile, certFile, keyFile
}

// ping is the error of a PING by the client that args build.
func ping(t *testing.T, args ...string) error {
	t.Helper()
	c := client(t, args...)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return c.Ping(ctx).Err()
}

// TestTLS: a Redis that requires TLS and client certificates (mutual TLS)
// answers a client with its CA and a certificate, given as a rediss:// URL
// or as host:port with -redis-tls, and decisions work in mode central over
// it. Without the CA the client fails naming the unknown authority; without
// a certificate, or with the wrong server name, it fails too.
func TestTLS(t *testing.T) {
	srv, caFile, certFile, keyFile := tlsRedis(t, true)
	url := "rediss://" + srv.Addr
	mutual := []string{"-redis-ca-file", caFile, "-redis-cert-file", certFile, "-redis-key-file", keyFile}

	for name, args := range map[string][]string{
		"rediss://":      append([]string{"-redis-addr", url}, mutual...),
		"-redis-tls":     append([]string{"-redis-addr", srv.Addr, "-redis-tls"}, mutual...),
		"files alone":    append([]string{"-redis-addr", srv.Addr}, mutual...),
		"localhost name": append([]string{"-redis-addr", url, "-redis-tls-server-name", "localhost"}, mutual...),
	} {
		if err := ping(t, args...); err != nil {
			t.Errorf("%s: PING over mutual TLS: %v", name, err)
		}
	}

	for _, c := range []struct {
		name string
		args []string
		want string // in the error
	}{
		{"plain text", []string{"-redis-addr", srv.Addr}, ""},
		{"no CA", []string{"-redis-addr", url, "-redis-cert-file", certFile, "-redis-key-file", keyFile}, "certificate signed by unknown authority"},
		{"no client certificate", []string{"-redis-addr", url, "-redis-ca-file", caFile}, "certificate"},
		{"wrong server name", append([]string{"-redis-addr", url, "-redis-tls-server-name", "redis.example.com"}, mutual...), "redis.example.com"},
	} {
		err := ping(t, c.args...)
		t.Logf("%s: %v", c.name, err)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: PING = %v, want an error with %q", c.name, err, c.want)
		}
	}

	// Decisions in mode central, over mutual TLS.
	rdb := client(t, append([]string{"-redis-addr", url}, mutual...)...)
	p, err := samplePlane(t).WithVersion(1).Override(policy.Overrides{Mode: "central"})
	if err != nil {
		t.Fatal(err)
	}
	// A deadline a TLS handshake under -race on a busy machine does not
	// blow (50 ms did, in make test): this test is about TLS, not latency.
	e, err := enforcer.New(p, enforcer.WithRedis(rdb), enforcer.WithNodeID("tls-1"), enforcer.WithRedisTimeout(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	ctx := context.Background()
	for range 5 {
		d, err := e.Decide(ctx, enforcer.Request{Tenant: "acme", Endpoint: "read", Units: 1})
		if err != nil || !d.Allow {
			t.Fatalf("a central decision over TLS: %+v, %v", d, err)
		}
	}
	if s := e.BackendStatus(); s.Degraded {
		t.Fatalf("central over TLS is degraded: %+v", s)
	}
	if n, err := rdb.Exists(ctx, keyspace.PlanePrefix(p.ID()).Global()).Result(); err != nil || n != 1 {
		t.Fatalf("no global bucket in Redis after central decisions over TLS: %d, %v", n, err)
	}
}

// TestTLSServerOnly: a Redis that asks no client certificate answers a
// client that trusts its CA.
func TestTLSServerOnly(t *testing.T) {
	srv, caFile, _, _ := tlsRedis(t, false)
	if err := ping(t, "-redis-addr", "rediss://"+srv.Addr, "-redis-ca-file", caFile); err != nil {
		t.Fatalf("PING over TLS: %v", err)
	}
}

// TestBadFlags: flags that cannot work are refused with an error that names
// what to fix, before any connection.
func TestBadFlags(t *testing.T) {
	dir := t.TempDir()
	notPEM := authntest.Write(t, dir, "not-pem", []byte("hello"))
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-redis-addr", "redis://127.0.0.1:6379", "-redis-ca-file", notPEM}, "use rediss://"},
		{[]string{"-redis-addr", "rediss://127.0.0.1:6379", "-redis-ca-file", notPEM}, "holds no PEM certificate"},
		{[]string{"-redis-addr", "rediss://127.0.0.1:6379", "-redis-ca-file", dir + "/missing"}, "-redis-ca-file"},
		{[]string{"-redis-addr", "rediss://127.0.0.1:6379", "-redis-cert-file", notPEM}, "give both or neither"},
		{[]string{"-redis-addr", "rediss://127.0.0.1:6379", "-redis-cert-file", notPEM, "-redis-key-file", notPEM}, "-redis-cert-file"},
		{[]string{"-redis-addr", "rediss://user:secret@127.0.0.1:6379"}, "do not put credentials in the URL"},
		{[]string{"-redis-addr", "rediss://127.0.0.1:6379/2"}, "no path"},
		{[]string{"-redis-addr", "http://127.0.0.1:6379"}, "redis:// or rediss://"},
	} {
		_, _, err := flags(t, c.args...).Client()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: got %v, want an error with %q", c.args, err, c.want)
		}
		if err != nil && strings.Contains(err.Error(), "secret") {
			t.Errorf("%v: the error shows the password: %v", c.args, err)
		}
	}
	opts, err := flags(t, "-redis-addr", "rediss://redis.example.com").Options()
	if err != nil || opts.Addr != "redis.example.com:6379" || opts.TLSConfig == nil || opts.TLSConfig.ServerName != "redis.example.com" {
		t.Fatalf("rediss://redis.example.com: %+v, %v; want port 6379 and TLS for that name", opts, err)
	}
}
