package authn_test

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/quotaplane/quotaplane/pkg/authn"
	"github.com/quotaplane/quotaplane/pkg/authn/authntest"
)

const (
	tokenA = "token-a-0123456789abcdef"
	tokenB = "token-b-0123456789abcdef"
)

// clock is a settable clock for the recheck interval.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

func TestHTTPBearerToken(t *testing.T) {
	dir := t.TempDir()
	file := authntest.Write(t, dir, "token", []byte(tokenA+"\n"))
	clk := &clock{now: time.Unix(1_000_000, 0)}
	tokens, err := authn.NewTokenChecker(file, authn.WithClock(clk.Now), authn.WithRecheckInterval(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var served int
	srv := httptest.NewServer(authn.HTTP(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		served++
		w.WriteHeader(http.StatusNoContent)
	}), tokens))
	defer srv.Close()

	call := func(authorization ...string) (int, string, string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/api/read", nil)
		for _, a := range authorization {
			req.Header.Add("Authorization", a)
		}
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode == http.StatusUnauthorized {
			var e struct {
				Error string `json:"error"`
			}
			if err := json.Unmarshal(body, &e); err != nil || e.Error == "" {
				t.Fatalf("401 body %q is not {\"error\": \"...\"}", body)
			}
			if strings.Contains(e.Error, tokenA) || strings.Contains(e.Error, tokenB) || strings.Contains(e.Error, "wrong") {
				t.Fatalf("the error %q echoes a token", e.Error)
			}
		}
		return resp.StatusCode, resp.Header.Get("WWW-Authenticate"), string(body)
	}

	for _, tc := range []struct {
		name          string
		authorization []string
		status        int
		challenge     string
	}{
		{"no token", nil, 401, `Bearer realm="quotaplane"`},
		{"wrong token", []string{"Bearer wrong-token-0123456789"}, 401, `Bearer realm="quotaplane", error="invalid_token"`},
		{"empty token", []string{"Bearer "}, 401, `Bearer realm="quotaplane", error="invalid_token"`},
		{"basic scheme", []string{"Basic " + tokenA}, 401, `Bearer realm="quotaplane", error="invalid_token"`},
		{"token twice", []string{"Bearer " + tokenA, "Bearer " + tokenA}, 401, `Bearer realm="quotaplane", error="invalid_token"`},
		{"a prefix of the token", []string{"Bearer " + tokenA[:len(tokenA)-1]}, 401, `Bearer realm="quotaplane", error="invalid_token"`},
		{"right token", []string{"Bearer " + tokenA}, 204, ""},
		{"scheme in lower case", []string{"bearer " + tokenA}, 204, ""},
	} {
		status, challenge, body := call(tc.authorization...)
		if status != tc.status || challenge != tc.challenge {
			t.Errorf("%s: got %d %q (%s), want %d %q", tc.name, status, challenge, body, tc.status, tc.challenge)
		}
	}
	if served != 2 {
		t.Fatalf("the handler served %d requests, want the 2 with the right token", served)
	}

	// Rotation: B joins A, then A goes. The file is read again only once
	// the recheck interval has passed.
	authntest.Write(t, dir, "token", []byte(tokenA+"\n"+tokenB+"\n"))
	if status, _, _ := call("Bearer " + tokenB); status != 401 {
		t.Fatalf("token B accepted before the recheck interval passed: %d", status)
	}
	clk.Advance(time.Second)
	for _, tok := range []string{tokenA, tokenB} {
		if status, _, body := call("Bearer " + tok); status != 204 {
			t.Fatalf("after adding B, %s...: %d %s", tok[:7], status, body)
		}
	}
	authntest.Write(t, dir, "token", []byte(tokenB))
	clk.Advance(time.Second)
	if status, _, _ := call("Bearer " + tokenA); status != 401 {
		t.Fatalf("token A still accepted after it was removed: %d", status)
	}
	if status, _, _ := call("Bearer " + tokenB); status != 204 {
		t.Fatalf("token B refused: %d", status)
	}

	// A file that turns bad keeps the last good tokens.
	authntest.Write(t, dir, "token", []byte("short\n"))
	clk.Advance(time.Second)
	if status, _, _ := call("Bearer " + tokenB); status != 204 {
		t.Fatalf("a bad token file replaced the good tokens: %d", status)
	}
}

func TestTokenFileProblems(t *testing.T) {
	dir := t.TempDir()
	long := strings.Repeat("x", authn.MaxTokenBytes+1)
	many := strings.Repeat(tokenA+"\n", authn.MaxTokens+1)
	for _, tc := range []struct{ name, contents, want string }{
		{"empty", "", "holds no token"},
		{"blank lines", "\n \n", "holds no token"},
		{"short", "abc", "line 1: a token must be 16 to 4096 characters long"},
		{"long", long, "a token must be 16 to 4096"},
		{"space inside", "\n0123456789 abcdefgh", "line 2: a token must be printable ASCII without spaces"},
		{"too many", many, "holds more than 16 tokens"},
	} {
		file := authntest.Write(t, dir, tc.name, []byte(tc.contents))
		_, err := authn.NewTokenChecker(file)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want an error containing %q", tc.name, err, tc.want)
		}
	}
	if _, err := authn.NewTokenChecker(dir + "/missing"); err == nil || !strings.Contains(err.Error(), "no such file") {
		t.Errorf("missing file: got %v", err)
	}
	tokens, err := authn.NewTokenChecker(authntest.Write(t, dir, "ok", []byte("  "+tokenA+"  \r\n\n"+tokenB)))
	if err != nil {
		t.Fatal(err)
	}
	if !tokens.Valid(tokenA) || !tokens.Valid(tokenB) || tokens.Valid("") || tokens.Valid(tokenA+" ") {
		t.Fatal("Valid disagrees with the file")
	}
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		c    authn.Config
		want string
		mode string
	}{
		{authn.Config{}, "", "none"},
		{authn.Config{CertFile: "c"}, "set both files or neither", ""},
		{authn.Config{KeyFile: "k"}, "set both files or neither", ""},
		{authn.Config{ClientCAFile: "ca"}, "a client CA needs TLS", ""},
		{authn.Config{CertFile: "c", KeyFile: "k"}, "", "tls"},
		{authn.Config{CertFile: "c", KeyFile: "k", ClientCAFile: "ca"}, "", "mtls"},
		{authn.Config{TokenFile: "t"}, "", "token"},
		{authn.Config{CertFile: "c", KeyFile: "k", ClientCAFile: "ca", TokenFile: "t"}, "", "mtls+token"},
	} {
		err := tc.c.Validate()
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%+v: got %v, want %q", tc.c, err, tc.want)
		}
		if tc.mode != "" && tc.c.Mode() != tc.mode {
			t.Errorf("%+v: mode %q, want %q", tc.c, tc.c.Mode(), tc.mode)
		}
	}
}

// grpcServer serves the health service with c's authentication on a
// loopback port.
func grpcServer(t *testing.T, c authn.Config, opts ...authn.Option) string {
	t.Helper()
	serverOpts, err := c.GRPCServerOptions(opts...)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(serverOpts...)
	healthpb.RegisterHealthServer(srv, health.NewServer())
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return lis.Addr().String()
}

func healthCheck(t *testing.T, addr string, creds credentials.TransportCredentials, md ...string) error {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if len(md) > 0 {
		ctx = metadata.AppendToOutgoingContext(ctx, md...)
	}
	client := healthpb.NewHealthClient(conn)
	resp, err := client.Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		return err
	}
	if resp.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health: %v", resp.Status)
	}
	// The stream interceptor: Watch's first answer, or its refusal.
	stream, err := client.Watch(ctx, &healthpb.HealthCheckRequest{})
	if err == nil {
		_, err = stream.Recv()
	}
	return err
}

func TestGRPCBearerToken(t *testing.T) {
	file := authntest.Write(t, t.TempDir(), "token", []byte(tokenA))
	addr := grpcServer(t, authn.Config{TokenFile: file})
	plain := insecure.NewCredentials()
	for _, tc := range []struct {
		name string
		md   []string
		code codes.Code
	}{
		{"no token", nil, codes.Unauthenticated},
		{"wrong token", []string{"authorization", "Bearer " + tokenB}, codes.Unauthenticated},
		{"right token", []string{"authorization", "Bearer " + tokenA}, codes.OK},
	} {
		err := healthCheck(t, addr, plain, tc.md...)
		if status.Code(err) != tc.code {
			t.Errorf("%s: got %v, want %v", tc.name, err, tc.code)
		}
	}
}

func TestGRPCMutualTLS(t *testing.T) {
	dir := t.TempDir()
	ca, other := authntest.NewCA(t, "callers"), authntest.NewCA(t, "someone else")
	certPEM, keyPEM := ca.Server(t, "enforcer")
	c := authn.Config{
		CertFile:     authntest.Write(t, dir, "tls.crt", certPEM),
		KeyFile:      authntest.Write(t, dir, "tls.key", keyPEM),
		ClientCAFile: authntest.Write(t, dir, "ca.crt", ca.PEM),
	}
	clk := &clock{now: time.Unix(1_000_000, 0)}
	addr := grpcServer(t, c, authn.WithClock(clk.Now))
	client := func(certs ...tls.Certificate) credentials.TransportCredentials {
		return credentials.NewTLS(&tls.Config{RootCAs: ca.Pool(), Certificates: certs, ServerName: "127.0.0.1"})
	}
	if err := healthCheck(t, addr, client()); status.Code(err) != codes.Unavailable {
		t.Fatalf("without a client certificate: got %v, want a failed handshake (Unavailable)", err)
	}
	if err := healthCheck(t, addr, client(other.Client(t, "intruder"))); status.Code(err) != codes.Unavailable {
		t.Fatalf("with another CA's client certificate: got %v, want a failed handshake (Unavailable)", err)
	}
	if err := healthCheck(t, addr, insecure.NewCredentials()); err == nil {
		t.Fatal("a plain-text client was served")
	}
	if err := healthCheck(t, addr, client(ca.Client(t, "envoy"))); err != nil {
		t.Fatalf("with a client certificate of the CA: %v", err)
	}

	// The CA bundle rotates to the other CA: its clients get in, the first
	// CA's no longer do.
	authntest.Write(t, dir, "ca.crt", other.PEM)
	clk.Advance(time.Second)
	if err := healthCheck(t, addr, client(other.Client(t, "envoy-2"))); err != nil {
		t.Fatalf("after the CA bundle rotated, a client of the new CA: %v", err)
	}
	if err := healthCheck(t, addr, client(ca.Client(t, "envoy"))); status.Code(err) != codes.Unavailable {
		t.Fatalf("after the CA bundle rotated, a client of the old CA: got %v", err)
	}
}

func TestCertificateRotation(t *testing.T) {
	dir := t.TempDir()
	ca := authntest.NewCA(t, "ca")
	certPEM, keyPEM := ca.Server(t, "first")
	c := authn.Config{CertFile: authntest.Write(t, dir, "tls.crt", certPEM), KeyFile: authntest.Write(t, dir, "tls.key", keyPEM)}
	clk := &clock{now: time.Unix(1_000_000, 0)}
	cfg, err := c.ServerTLS(authn.WithClock(clk.Now))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	srv.TLS = cfg
	srv.StartTLS()
	defer srv.Close()
	served := func() string {
		t.Helper()
		conn, err := tls.Dial("tcp", srv.Listener.Addr().String(), &tls.Config{RootCAs: ca.Pool(), ServerName: "localhost"})
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		return conn.ConnectionState().PeerCertificates[0].Subject.CommonName
	}
	if got := served(); got != "first" {
		t.Fatalf("served %q, want first", got)
	}
	certPEM, keyPEM = ca.Server(t, "second")
	authntest.Write(t, dir, "tls.crt", certPEM)
	authntest.Write(t, dir, "tls.key", keyPEM)
	if got := served(); got != "first" {
		t.Fatalf("served %q before the recheck interval passed, want first", got)
	}
	clk.Advance(time.Second)
	if got := served(); got != "second" {
		t.Fatalf("served %q after rotation, want second", got)
	}
	// A key that does not match its certificate is not taken.
	other, _ := ca.Server(t, "third")
	authntest.Write(t, dir, "tls.crt", other)
	clk.Advance(time.Second)
	if got := served(); got != "second" {
		t.Fatalf("served %q with a mismatched key pair on disk, want the last good (second)", got)
	}
}

func TestServerTLSProblems(t *testing.T) {
	dir := t.TempDir()
	ca := authntest.NewCA(t, "ca")
	certPEM, keyPEM := ca.Server(t, "x")
	cert, key := authntest.Write(t, dir, "tls.crt", certPEM), authntest.Write(t, dir, "tls.key", keyPEM)
	notPEM := authntest.Write(t, dir, "junk", []byte("not a certificate"))
	for _, tc := range []struct {
		c    authn.Config
		want string
	}{
		{authn.Config{CertFile: cert, KeyFile: notPEM}, "certificate " + cert + " and key " + notPEM},
		{authn.Config{CertFile: cert, KeyFile: key, ClientCAFile: notPEM}, "client CA file " + notPEM + " holds no PEM certificate"},
		{authn.Config{CertFile: cert, KeyFile: dir + "/missing"}, "no such file"},
	} {
		if _, err := tc.c.ServerTLS(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: got %v, want %q", tc.c, err, tc.want)
		}
	}
	if cfg, err := (authn.Config{}).ServerTLS(); cfg != nil || err != nil {
		t.Fatalf("no files: got %v, %v; want plain text", cfg, err)
	}
}
