package main

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/quotaplane/quotaplane/pkg/authn/authntest"
	"github.com/quotaplane/quotaplane/pkg/policy"
	"github.com/quotaplane/quotaplane/pkg/redistest"
	"github.com/quotaplane/quotaplane/pkg/store"
)

const (
	apiToken  = "api-token-0123456789abcdef"
	grpcToken = "grpc-token-0123456789abcdef"
)

// apiCall is POST /api/read for tenant acme over client, with an optional
// Authorization field; it returns the status (0 when the connection
// failed) and the body.
func apiCall(t *testing.T, client *http.Client, url, authorization string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url+"/api/read", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Tenant", "acme")
	req.Header.Set("X-Api-Key", "k1")
	if authorization != "" {
		req.Header.Set("Authorization", authorization)
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get("WWW-Authenticate") + " " + string(body)
}

// grpcCall calls ShouldRateLimit for acme over conn with an optional
// bearer token.
func grpcCall(conn *grpc.ClientConn, token string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if token != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
	}
	resp, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "gw", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("tenant=acme")}})
	if err == nil && resp.OverallCode != rlsv3.RateLimitResponse_OK {
		return status.Errorf(codes.Unknown, "not OK: %v", resp)
	}
	return err
}

// TestMutualTLS: the API listener requires a client certificate of its
// CA; the gRPC listener requires one and a bearer token. Without either,
// or with another CA's certificate, nothing is decided.
func TestMutualTLS(t *testing.T) {
	dir := t.TempDir()
	serverCA, callers, other := authntest.NewCA(t, "enforcer"), authntest.NewCA(t, "callers"), authntest.NewCA(t, "someone else")
	certPEM, keyPEM := serverCA.Server(t, "enforcer")
	cert, key := authntest.Write(t, dir, "tls.crt", certPEM), authntest.Write(t, dir, "tls.key", keyPEM)
	clientCA := authntest.Write(t, dir, "ca.crt", callers.PEM)
	token := authntest.Write(t, dir, "token", []byte(grpcToken+"\n"))
	p := startEnforcer(t, writePlane(t, planeYAML("", "")),
		"-tls-cert-file", cert, "-tls-key-file", key, "-client-ca-file", clientCA,
		"-grpc-tls-cert-file", cert, "-grpc-tls-key-file", key, "-grpc-client-ca-file", clientCA, "-grpc-token-file", token)

	tlsConfig := func(certs ...tls.Certificate) *tls.Config {
		return &tls.Config{RootCAs: serverCA.Pool(), ServerName: "127.0.0.1", Certificates: certs}
	}
	envoy := callers.Client(t, "envoy")
	intruder := other.Client(t, "intruder")

	// gRPC
	good := p.dial(grpc.WithTransportCredentials(credentials.NewTLS(tlsConfig(envoy))))
	if err := grpcCall(good, grpcToken); err != nil {
		t.Fatalf("gRPC with a client certificate and the token: %v", err)
	}
	if err := grpcCall(good, ""); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("gRPC with a client certificate, without the token: got %v, want Unauthenticated", err)
	}
	if err := grpcCall(p.dial(grpc.WithTransportCredentials(credentials.NewTLS(tlsConfig()))), grpcToken); status.Code(err) != codes.Unavailable {
		t.Fatalf("gRPC without a client certificate: got %v, want a failed handshake (Unavailable)", err)
	}
	if err := grpcCall(p.dial(grpc.WithTransportCredentials(credentials.NewTLS(tlsConfig(intruder)))), grpcToken); status.Code(err) != codes.Unavailable {
		t.Fatalf("gRPC with another CA's certificate: got %v, want a failed handshake (Unavailable)", err)
	}
	if err := grpcCall(p.dial(), grpcToken); err == nil {
		t.Fatal("gRPC in plain text was served")
	}

	// HTTP API
	url := "https://" + p.apiAddr
	if code, body := apiCall(t, httpsClient(tlsConfig(envoy)), url, ""); code != 200 {
		t.Fatalf("API with a client certificate: %d %s", code, body)
	}
	for name, client := range map[string]*http.Client{"no certificate": httpsClient(tlsConfig()), "another CA's": httpsClient(tlsConfig(intruder))} {
		if code, body := apiCall(t, client, url, ""); code != 0 || !strings.Contains(body, "certificate") {
			t.Fatalf("API with %s: %d %s; want the handshake refused", name, code, body)
		}
	}
	if left, _ := p.remaining("acme"); left["tenant"] != 98 {
		t.Fatalf("acme's tenant level after 2 admitted decisions: %v", left)
	}
}

// TestBearerTokens: each listener requires its own token; a missing or
// wrong one is 401 (HTTP, with WWW-Authenticate: Bearer) or
// Unauthenticated (gRPC), and nothing is decided. The gRPC listener's file
// comes from its environment twin.
func TestBearerTokens(t *testing.T) {
	dir := t.TempDir()
	p := startEnforcerEnv(t, writePlane(t, planeYAML("", "")),
		[]string{"QUOTAPLANE_GRPC_TOKEN_FILE=" + authntest.Write(t, dir, "grpc-token", []byte(grpcToken))},
		"-token-file", authntest.Write(t, dir, "api-token", []byte(apiToken)))

	url := "http://" + p.apiAddr
	client := &http.Client{Timeout: 10 * time.Second}
	for _, tc := range []struct {
		name, authorization string
		code                int
		want                string
	}{
		{"no token", "", 401, `Bearer realm="quotaplane" {"error":"missing bearer token`},
		{"wrong token", "Bearer not-the-token-0123456789", 401, `error="invalid_token" {"error":"the bearer token is not one`},
		{"the gRPC listener's token", "Bearer " + grpcToken, 401, "invalid_token"},
		{"the token", "Bearer " + apiToken, 200, `"allowed":true`},
	} {
		if code, body := apiCall(t, client, url, tc.authorization); code != tc.code || !strings.Contains(body, tc.want) {
			t.Errorf("API, %s: %d %s; want %d with %q", tc.name, code, body, tc.code, tc.want)
		}
	}

	conn := p.dial()
	for _, tc := range []struct {
		name, token string
		code        codes.Code
	}{
		{"no token", "", codes.Unauthenticated},
		{"wrong token", "not-the-token-0123456789", codes.Unauthenticated},
		{"the API listener's token", apiToken, codes.Unauthenticated},
		{"the token", grpcToken, codes.OK},
	} {
		if err := grpcCall(conn, tc.token); status.Code(err) != tc.code {
			t.Errorf("gRPC, %s: got %v, want %v", tc.name, err, tc.code)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}); status.Code(err) != codes.Unauthenticated {
		t.Errorf("health without the token: got %v, want Unauthenticated", err)
	}
	if left, _ := p.remaining("acme"); left["tenant"] != 98 {
		t.Fatalf("acme's tenant level after 2 admitted decisions: %v", left)
	}
}

// TestBadAuthnFlags: the enforcer refuses to start with half a TLS
// configuration or an unreadable token file, and says which flags.
func TestBadAuthnFlags(t *testing.T) {
	dir := writePlane(t, planeYAML("", ""))
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-tls-cert-file", "x.crt"}, "the API listener (-tls-cert-file, -tls-key-file, -client-ca-file, -token-file): a certificate needs its key"},
		{[]string{"-grpc-client-ca-file", "ca.crt"}, "the gRPC listener (-grpc-tls-cert-file, -grpc-tls-key-file, -grpc-client-ca-file, -grpc-token-file): a client CA needs TLS"},
		{[]string{"-grpc-token-file", filepath.Join(t.TempDir(), "missing")}, "token file: open"},
		{[]string{"-redis-timeout", "0s"}, "-redis-timeout 0s: it must be positive"},
	} {
		out, err := runEnforcer(t, append([]string{"-policy", dir, "-listen", freeAddr(t), "-admin-listen", freeAddr(t), "-grpc-listen", freeAddr(t)}, tc.args...)...)
		if err == nil || !strings.Contains(out, tc.want) {
			t.Errorf("%v: %v\n%s\nwant an error containing %q", tc.args, err, out, tc.want)
		}
	}
}

// TestBeforeFirstPolicy: an enforcer following the policy store listens at
// once; until the plane's first policy gRPC answers Unavailable and health
// NOT_SERVING, then SERVING and decisions.
func TestBeforeFirstPolicy(t *testing.T) {
	redis := redistest.Start(t)
	p := startEnforcer(t, "", "-redis-addr", redis.Addr, "-plane", "default/gw")
	conn := p.dial()
	health := healthpb.NewHealthClient(conn)
	p.waitFor("gRPC health answers NOT_SERVING", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		resp, err := health.Check(ctx, &healthpb.HealthCheckRequest{})
		return err == nil && resp.Status == healthpb.HealthCheckResponse_NOT_SERVING
	})
	if err := grpcCall(conn, ""); status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "no policy loaded yet") {
		t.Fatalf("ShouldRateLimit before the first policy: got %v, want Unavailable", err)
	}

	objs, err := policy.DecodeYAML([]byte(planeYAML("", "")))
	if err != nil {
		t.Fatal(err)
	}
	plane, problems := policy.Compile(objs)
	if len(problems) > 0 {
		t.Fatal(problems)
	}
	policies, err := store.New(redis.Client(), "default/gw")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, _, err := policies.Publish(ctx, plane); err != nil {
		t.Fatal(err)
	}
	p.waitServing(conn)
	if err := grpcCall(conn, ""); err != nil {
		t.Fatalf("ShouldRateLimit after the first policy: %v", err)
	}
}

// TestRedisACLUser: the enforcer reaches a Redis that requires a user and
// a password as that ACL user, the password read from a file (a mounted
// Secret), as the manager does; the password appears nowhere in its
// output.
func TestRedisACLUser(t *testing.T) {
	const user, password = "qp-enforcer", "acl-password-must-not-be-logged"
	srv := redistest.Start(t, "--requirepass", "admin-password")
	admin := srv.Client()
	if err := admin.Do(context.Background(), "ACL", "SETUSER", user, "on", ">"+password, "~qp:*", "resetchannels", "+@all", "-@admin").Err(); err != nil {
		t.Fatal(err)
	}
	secret := filepath.Join(t.TempDir(), "password")
	if err := os.WriteFile(secret, []byte(password+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	dir := writePlane(t, planeYAML("", ""))
	p := startEnforcer(t, dir, "-mode", "central", "-redis-addr", srv.Addr, "-redis-username", user, "-redis-password-file", secret)
	req, _ := http.NewRequest(http.MethodPost, "http://"+p.apiAddr+"/api/read", nil)
	req.Header.Set("X-Tenant", "acme")
	req.Header.Set("X-Api-Key", "k-acl")
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("decision: %v, %v", resp, err)
	}
	resp.Body.Close()
	// Decided in Redis, as the ACL user: the plane's global bucket is there.
	keys, err := admin.Keys(context.Background(), "qp:*:g").Result()
	if err != nil || len(keys) == 0 {
		t.Fatalf("no global bucket in Redis after a central decision (keys %v, %v): the enforcer did not reach Redis as %s", keys, err, user)
	}
	if out := p.output(); strings.Contains(out, password) {
		t.Fatalf("the enforcer's output shows the Redis password:\n%s", out)
	}
}

// TestAdminBeyondLoopback: an admin listener reachable beyond loopback
// keeps the probes and /metrics open and answers /quota/debug (it shows
// any tenant's live state) only to clients on loopback, unless
// -admin-token-file is set, which then guards all but the probes.
func TestAdminBeyondLoopback(t *testing.T) {
	var outside string // an address of this host's that is not loopback
	if addrs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range addrs {
			if ip, ok := a.(*net.IPNet); ok && !ip.IP.IsLoopback() && ip.IP.To4() != nil {
				outside = ip.IP.String()
				break
			}
		}
	}
	if outside == "" {
		t.Skip("this host has no address but loopback")
	}
	dir := writePlane(t, planeYAML("", ""))
	get := func(p *process, host, path, token string) int {
		t.Helper()
		_, port, _ := net.SplitHostPort(p.adminAddr)
		req, _ := http.NewRequest(http.MethodGet, "http://"+net.JoinHostPort(host, port)+path, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	// Every interface, on a free port.
	open := func() string { return strings.Replace(freeAddr(t), "127.0.0.1", "0.0.0.0", 1) }

	p := startEnforcer(t, dir, "-admin-listen", open())
	for _, c := range []struct {
		host, path string
		want       int
	}{
		{outside, "/readyz", 200}, {outside, "/metrics", 200}, {outside, "/quota/debug?tenant=acme", 403}, {outside, "/quota/ui", 403}, {outside, "/debug/pprof/heap", 403},
		{"127.0.0.1", "/quota/debug?tenant=acme", 200}, {"127.0.0.1", "/quota/ui", 200}, {"127.0.0.1", "/debug/pprof/heap?debug=1", 200},
	} {
		if got := get(p, c.host, c.path, ""); got != c.want {
			t.Errorf("no token file: GET %s from %s = %d, want %d", c.path, c.host, got, c.want)
		}
	}

	tokens := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(tokens, []byte("admin-token-0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	q := startEnforcer(t, dir, "-admin-listen", open(), "-admin-token-file", tokens)
	for _, c := range []struct {
		path, token string
		want        int
	}{
		{"/readyz", "", 200}, {"/metrics", "", 401}, {"/quota/debug?tenant=acme", "", 401},
		{"/metrics", "admin-token-0123456789", 200}, {"/quota/debug?tenant=acme", "admin-token-0123456789", 200}, {"/quota/debug?tenant=acme", "wrong", 401},
		{"/quota/ui", "", 401}, {"/quota/ui", "admin-token-0123456789", 200}, {"/debug/pprof/heap", "", 401},
	} {
		if got := get(q, outside, c.path, c.token); got != c.want {
			t.Errorf("with a token file: GET %s (token %q) = %d, want %d", c.path, c.token, got, c.want)
		}
	}
}
