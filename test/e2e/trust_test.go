package e2e

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/pkg/authn/authntest"
	"github.com/quotaplane/quotaplane/pkg/keyspace"
	"github.com/quotaplane/quotaplane/pkg/policy"
	"github.com/quotaplane/quotaplane/pkg/poll"
	"github.com/quotaplane/quotaplane/pkg/redistest"
	"github.com/quotaplane/quotaplane/pkg/store"
	"github.com/quotaplane/quotaplane/pkg/testenv"
)

// TestTrustEndToEnd: the manager and an enforcer, as processes, with the
// whole trust set-up of docs/security.md: Redis over mutual TLS, each as
// its ACL user of pkg/keyspace (passwords from files), the manager signing
// with its private key, the enforcer holding only the public key. The
// samples applied to the API server are published signed, loaded and
// decided on; Redis denied neither user anything (ACL LOG empty); neither
// password appears in either process's output.
func TestTrustEndToEnd(t *testing.T) {
	t.Parallel() // bounds no timing (package doc)
	const (
		ns               = "trust"
		managerPassword  = "manager-password-never-logged"
		enforcerPassword = "enforcer-password-never-logged"
	)
	plane := ns + "/main"
	bins := build(t, "manager", "enforcer")
	env := testenv.Start(t)
	dir := t.TempDir()

	ca := authntest.NewCA(t, "redis-ca")
	serverCert, serverKey := ca.Server(t, "redis")
	clientCert, clientKey := ca.ClientPEM(t, "quotaplane")
	pair, err := tls.X509KeyPair(clientCert, clientKey)
	if err != nil {
		t.Fatal(err)
	}
	caFile := authntest.Write(t, dir, "ca.crt", ca.PEM)
	r := redistest.StartTLS(t, redistest.TLS{
		CertFile: authntest.Write(t, dir, "server.crt", serverCert), KeyFile: authntest.Write(t, dir, "server.key", serverKey),
		CAFile: caFile, AuthClients: true,
		Client: &tls.Config{RootCAs: ca.Pool(), Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12},
	}, "--requirepass", "admin-password")
	admin := r.Client()
	ctx := context.Background()
	for user, u := range map[string]struct {
		password string
		rules    []string
	}{"quotaplane-manager": {managerPassword, keyspace.ManagerACL("*")}, "quotaplane-enforcer": {enforcerPassword, keyspace.EnforcerACL("*")}} {
		args := []any{"ACL", "SETUSER", user, "reset", "on", ">" + u.password}
		for _, rule := range u.rules {
			args = append(args, rule)
		}
		if err := admin.Do(ctx, args...).Err(); err != nil {
			t.Fatal(err)
		}
	}
	public, private, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	privatePEM, err := store.MarshalSigningKey(private)
	if err != nil {
		t.Fatal(err)
	}
	publicPEM, err := store.MarshalVerificationKey(public)
	if err != nil {
		t.Fatal(err)
	}
	tlsFlags := []string{"-redis-addr", "rediss://" + r.Addr, "-redis-ca-file", caFile,
		"-redis-cert-file", authntest.Write(t, dir, "client.crt", clientCert), "-redis-key-file", authntest.Write(t, dir, "client.key", clientKey)}

	manager := start(t, bins["manager"], nil, append(tlsFlags,
		"-kubeconfig", adminKubeconfig(t, env),
		"-redis-username", "quotaplane-manager", "-redis-password-file", authntest.Write(t, dir, "manager-password", []byte(managerPassword)),
		"-policy-signing-key-file", authntest.Write(t, dir, "signing.pem", privatePEM),
		"-metrics-bind-address", "0", "-health-probe-bind-address", "127.0.0.1:"+freePort(t), "-fleet-interval", "200ms")...)
	e := &enforcerNode{id: "trust-enforcer", api: "127.0.0.1:" + freePort(t), admin: "127.0.0.1:" + freePort(t)}
	enforcer := start(t, bins["enforcer"], nil, append(tlsFlags,
		"-redis-username", "quotaplane-enforcer", "-redis-password-file", authntest.Write(t, dir, "enforcer-password", []byte(enforcerPassword)),
		"-policy-public-key-file", authntest.Write(t, dir, "public.pem", publicPEM),
		"-plane", plane, "-node-id", e.id, "-listen", e.api, "-admin-listen", e.admin, "-grpc-listen", "127.0.0.1:0", "-drain", "0s")...)

	objs := createSamples(t, env.Client, ns)
	want, problems := policy.Compile(objs)
	if len(problems) > 0 {
		t.Fatal(problems)
	}
	verified, err := store.New(admin, plane, store.WithVerifier(store.NewVerifier(public)))
	if err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 60*time.Second, "the manager publishes the samples, signed", func() bool {
		p, err := verified.Current(ctx)
		return err == nil && p.Hash() == want.Hash()
	})
	poll.Until(t, 30*time.Second, "the enforcer is ready and decides", func() bool {
		req, _ := http.NewRequest(http.MethodPost, "http://"+e.api+"/api/read", nil)
		req.Header.Set("X-Tenant", "acme")
		req.Header.Set("X-Api-Key", "trust-key")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	poll.Until(t, 30*time.Second, "the manager reads the enforcer's report", func() bool {
		reports, err := verified.Enforcers(ctx)
		return err == nil && len(reports) == 1 && reports[0].ID == e.id
	})

	entries, err := admin.ACLLog(ctx, 100).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, entry := range entries {
		t.Errorf("Redis denied %s: %s %q (%s)", entry.Username, entry.Reason, entry.Object, entry.Context)
	}
	for _, p := range []*process{manager, enforcer} {
		out := p.output()
		for _, secret := range []string{managerPassword, enforcerPassword} {
			if strings.Contains(out, secret) {
				t.Errorf("%s's output shows a Redis password:\n%s", p.name, out)
			}
		}
	}
	if !strings.Contains(manager.output(), `"policySigningKey":"`+store.KeyID(public)+`"`) && !strings.Contains(manager.output(), "policySigningKey="+store.KeyID(public)) {
		t.Errorf("the manager does not log the id of its signing key:\n%s", manager.output())
	}
}
