package main

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/quotaplane/quotaplane/pkg/authn/authntest"
	"github.com/quotaplane/quotaplane/pkg/keyspace"
	"github.com/quotaplane/quotaplane/pkg/policy"
	"github.com/quotaplane/quotaplane/pkg/redistest"
	"github.com/quotaplane/quotaplane/pkg/store"
)

// TestTrustedRedis: the enforcer process with the whole trust setup of
// docs/security.md: Redis over mutual TLS, as the enforcer ACL user of
// pkg/keyspace (password from a file), loading only policies the manager's
// key signed. It follows the store and decides in central mode without a
// denial in Redis's ACL LOG; a version injected in Redis is refused,
// counted on /metrics (policy_loads_total{result="unverified"}) and
// logged, the last good version stays in force; the manager's next version
// loads. The password shows nowhere in its output.
func TestTrustedRedis(t *testing.T) {
	const password = "enforcer-acl-password-never-logged"
	dir := t.TempDir()
	ca := authntest.NewCA(t, "redis-ca")
	serverCert, serverKey := ca.Server(t, "redis")
	clientCert, clientKey := ca.ClientPEM(t, "enforcer")
	pair, err := tls.X509KeyPair(clientCert, clientKey)
	if err != nil {
		t.Fatal(err)
	}
	clientTLS := &tls.Config{RootCAs: ca.Pool(), Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}
	srv := redistest.StartTLS(t, redistest.TLS{
		CertFile: authntest.Write(t, dir, "server.crt", serverCert), KeyFile: authntest.Write(t, dir, "server.key", serverKey),
		CAFile: authntest.Write(t, dir, "ca.crt", ca.PEM), AuthClients: true, Client: clientTLS,
	}, "--requirepass", "admin-password")
	admin := srv.Client()
	ctx := context.Background()
	setUser := func(name, pw string, rules []string) {
		args := []any{"ACL", "SETUSER", name, "reset", "on", ">" + pw}
		for _, r := range rules {
			args = append(args, r)
		}
		if err := admin.Do(ctx, args...).Err(); err != nil {
			t.Fatal(err)
		}
	}
	setUser("quotaplane-enforcer", password, keyspace.EnforcerACL("*"))
	setUser("quotaplane-manager", "manager-password", keyspace.ManagerACL("*"))
	managerClient := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: "quotaplane-manager", Password: "manager-password", TLSConfig: clientTLS})
	defer managerClient.Close()

	_, signingKey, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	publicPEM, err := store.MarshalVerificationKey(signingKey.Public().(ed25519.PublicKey))
	if err != nil {
		t.Fatal(err)
	}
	compile := func(globalPerHour int) *policy.Policy {
		objs, err := policy.DecodeYAML([]byte(strings.Replace(planeYAML("", ""), "rate: 1000, burst: 1000", "rate: "+itoa(int64(globalPerHour))+", burst: 1000", 1)))
		if err != nil {
			t.Fatal(err)
		}
		p, problems := policy.Compile(objs)
		if len(problems) > 0 {
			t.Fatal(problems)
		}
		return p
	}
	manager, err := store.New(managerClient, "default/gw", store.WithSigner(store.NewSigner(signingKey)))
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := manager.Publish(ctx, compile(1000)); err != nil {
		t.Fatalf("publish as the manager user over TLS: %v", err)
	}

	secret := filepath.Join(dir, "password")
	if err := os.WriteFile(secret, []byte(password+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startEnforcer(t, "", "-mode", "central", "-plane", "default/gw",
		"-redis-addr", "rediss://"+srv.Addr, "-redis-ca-file", filepath.Join(dir, "ca.crt"),
		"-redis-cert-file", authntest.Write(t, dir, "client.crt", clientCert), "-redis-key-file", authntest.Write(t, dir, "client.key", clientKey),
		"-redis-username", "quotaplane-enforcer", "-redis-password-file", secret,
		"-policy-public-key-file", authntest.Write(t, dir, "policy.pub", publicPEM))
	metrics := func() string {
		resp, err := http.Get("http://" + p.adminAddr + "/metrics")
		if err != nil {
			return ""
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	running := func(version string) func() bool {
		re := regexp.MustCompile(`(?m)^quotaplane_enforcer_policy_version\{[^}]*\} ` + version + `$`)
		return func() bool { return re.MatchString(metrics()) }
	}
	p.waitFor("signed version 1 is in force", running("1"))
	if status, body := apiCall(t, http.DefaultClient, "http://"+p.apiAddr, ""); status != http.StatusOK {
		t.Fatalf("a decision: %d %s", status, body)
	}

	forged := compile(999999).WithVersion(2)
	if err := admin.HSet(ctx, keyspace.Policy("default/gw"), "v2", forged.Encode(), "hash", forged.Hash(), "current", 2).Err(); err != nil {
		t.Fatal(err)
	}
	p.waitFor("the injected version is counted unverified", func() bool {
		return strings.Contains(metrics(), `quotaplane_enforcer_policy_loads_total{result="unverified"} 1`)
	})
	if !running("1")() {
		t.Fatalf("the injected version replaced version 1:\n%s", metrics())
	}
	if _, _, err := manager.Publish(ctx, compile(2000)); err != nil {
		t.Fatal(err)
	}
	p.waitFor("the manager's signed version 3 is in force", running("3"))
	p.waitFor("the enforcer reported version 3", func() bool {
		reports, err := manager.Enforcers(ctx)
		return err == nil && len(reports) == 1 && reports[0].PolicyVersion == 3
	})
	if status, body := apiCall(t, http.DefaultClient, "http://"+p.apiAddr, ""); status != http.StatusOK {
		t.Fatalf("a decision: %d %s", status, body)
	}
	if keys, _ := admin.Keys(ctx, "qp:*:g").Result(); len(keys) == 0 {
		t.Fatal("no global bucket: the decisions did not reach Redis")
	}

	entries, err := admin.ACLLog(ctx, 100).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		t.Errorf("Redis denied %s: %s %q (%s)", e.Username, e.Reason, e.Object, e.Context)
	}
	out := p.output()
	if strings.Contains(out, password) {
		t.Fatalf("the enforcer's output shows the Redis password:\n%s", out)
	}
	if !strings.Contains(out, "policy refused: its signature does not verify") {
		t.Fatalf("the refusal is not logged:\n%s", out)
	}
}
