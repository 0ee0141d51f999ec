// Package redisconn is how every binary reaches Redis: the same flags
// (address, ACL user, password from a file or the environment, TLS) build the
// same client, with the deadlines the engine relies on
// (ContextTimeoutEnabled). The password is never logged.
//
// # TLS
//
// TLS is on when the address is a rediss:// URL, when -redis-tls is set, or
// when any of -redis-ca-file, -redis-cert-file and -redis-key-file is given.
// The server's certificate is checked against -redis-ca-file (a PEM bundle;
// default the system's roots) for the address's host, or
// -redis-tls-server-name. A client certificate (-redis-cert-file with
// -redis-key-file) is sent when the server asks (Redis's
// tls-auth-clients); the pair is read again at each new connection, so a
// renewed Secret is picked up without a restart (a pair that does not load
// then keeps the last good one). There is no flag to skip verification: a
// test Redis gets a CA like any other.
package redisconn

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/quotaplane/quotaplane/pkg/envflag"
)

// Flags are a binary's Redis flags.
type Flags struct {
	Addr, Username, passwordFile *string

	tls                                      *bool
	caFile, certFile, keyFile, tlsServerName *string
}

// Register adds -redis-addr (described by addrHelp), -redis-username,
// -redis-password-file and the TLS flags (-redis-tls, -redis-ca-file,
// -redis-cert-file, -redis-key-file, -redis-tls-server-name) to fs, each
// with its QUOTAPLANE_ twin.
func Register(fs *flag.FlagSet, addrHelp string) *Flags {
	return &Flags{
		Addr: fs.String("redis-addr", envflag.String("QUOTAPLANE_REDIS_ADDR", ""),
			addrHelp+"; host:port, redis://host:port, or rediss://host:port for TLS [QUOTAPLANE_REDIS_ADDR]"),
		Username: fs.String("redis-username", envflag.String("QUOTAPLANE_REDIS_USERNAME", ""), "Redis ACL user [QUOTAPLANE_REDIS_USERNAME]"),
		passwordFile: fs.String("redis-password-file", envflag.String("QUOTAPLANE_REDIS_PASSWORD_FILE", ""),
			"file holding the Redis password, such as a mounted Secret (default: env QUOTAPLANE_REDIS_PASSWORD) [QUOTAPLANE_REDIS_PASSWORD_FILE]"),
		tls: fs.Bool("redis-tls", envflag.Bool("QUOTAPLANE_REDIS_TLS", false),
			"reach Redis over TLS (also implied by rediss:// and by any -redis-*-file of TLS) [QUOTAPLANE_REDIS_TLS]"),
		caFile: fs.String("redis-ca-file", envflag.String("QUOTAPLANE_REDIS_CA_FILE", ""),
			"PEM bundle of the CAs that sign Redis's certificate (default: the system's roots) [QUOTAPLANE_REDIS_CA_FILE]"),
		certFile: fs.String("redis-cert-file", envflag.String("QUOTAPLANE_REDIS_CERT_FILE", ""),
			"client certificate (PEM) sent to a Redis that requires one (tls-auth-clients), with -redis-key-file [QUOTAPLANE_REDIS_CERT_FILE]"),
		keyFile: fs.String("redis-key-file", envflag.String("QUOTAPLANE_REDIS_KEY_FILE", ""),
			"the client certificate's private key (PEM) [QUOTAPLANE_REDIS_KEY_FILE]"),
		tlsServerName: fs.String("redis-tls-server-name", envflag.String("QUOTAPLANE_REDIS_TLS_SERVER_NAME", ""),
			"the name Redis's certificate must carry (default: the address's host) [QUOTAPLANE_REDIS_TLS_SERVER_NAME]"),
	}
}

// Client returns a client of the Redis the flags name, and whether it
// sends a password (for logs).
func (f *Flags) Client() (c *redis.Client, hasPassword bool, err error) {
	opts, err := f.Options()
	if err != nil {
		return nil, false, err
	}
	return redis.NewClient(opts), opts.Password != "", nil
}

// EnforcerClient is Client for an enforcer: without go-redis's retries
// (MaxRetries -1). Every call an enforcer makes has a deadline of its own
// (-redis-timeout, 50 ms by default) and its own answer to a failure: the
// breaker and the plane's failureMode for a decision, the next interval
// for a reconcile, a report or a heartbeat. go-redis retries a READONLY
// answer (a primary demoted in a failover), LOADING, or a connection that
// broke, on another connection after a backoff (8 ms and more), which
// only spends that deadline: the error was the deadline's ("context
// deadline exceeded"), not Redis's, and the log could not tell a failover
// from a slow Redis. Without the retries a decision learns Redis's answer
// at once, and the log names it. A connection Redis closed while idle
// (a restart) is still replaced before use: the pool checks it.
//
// The manager and quotactl keep the retries (Client): their calls have no
// deadline that tight, and a publish sent twice stores its content once
// (publish.lua).
func (f *Flags) EnforcerClient() (c *redis.Client, hasPassword bool, err error) {
	opts, err := f.Options()
	if err != nil {
		return nil, false, err
	}
	opts.MaxRetries = -1
	return redis.NewClient(opts), opts.Password != "", nil
}

// Options are the client options the flags describe, checked: a bad address,
// an unreadable password file or TLS file is an error naming the flag.
func (f *Flags) Options() (*redis.Options, error) {
	addr, scheme, err := parseAddr(*f.Addr)
	if err != nil {
		return nil, err
	}
	password := os.Getenv("QUOTAPLANE_REDIS_PASSWORD")
	if *f.passwordFile != "" {
		b, err := os.ReadFile(*f.passwordFile)
		if err != nil {
			return nil, fmt.Errorf("read the Redis password (-redis-password-file): %w", err)
		}
		password = strings.TrimRight(string(b), "\r\n")
	}
	// DisableIdentity: no CLIENT SETINFO on connect, a command Redis
	// before 7.2 does not know and the components' ACL users need not run.
	opts := &redis.Options{Addr: addr, Username: *f.Username, Password: password, ContextTimeoutEnabled: true, DisableIdentity: true}
	wantTLS := f.wantsTLS(scheme)
	if wantTLS && scheme == "redis" {
		return nil, fmt.Errorf("-redis-addr %s is plain text (redis://) but TLS is asked for (-redis-tls or a -redis-*-file of TLS): use rediss://", *f.Addr)
	}
	if wantTLS {
		if opts.TLSConfig, err = f.tlsConfig(addr); err != nil {
			return nil, err
		}
	}
	return opts, nil
}

// TLS says whether the flags ask for TLS (for logs).
func (f *Flags) TLS() bool {
	_, scheme, _ := parseAddr(*f.Addr)
	return f.wantsTLS(scheme)
}

func (f *Flags) wantsTLS(scheme string) bool {
	return *f.tls || scheme == "rediss" || *f.caFile != "" || *f.certFile != "" || *f.keyFile != ""
}

// parseAddr reads host:port, redis://host[:port] or rediss://host[:port]
// (port default 6379). Credentials and databases have no place in the URL:
// the password would show in process listings and logs, and the scripts and
// Redis Cluster use database 0.
func parseAddr(raw string) (addr, scheme string, err error) {
	if !strings.Contains(raw, "://") {
		return raw, "", nil
	}
	u, err := url.Parse(raw)
	if err != nil {
		return "", "", fmt.Errorf("-redis-addr: %w", err)
	}
	if u.Scheme != "redis" && u.Scheme != "rediss" {
		return "", "", fmt.Errorf("-redis-addr %q: the scheme must be redis:// or rediss:// (TLS), or give host:port", raw)
	}
	if u.User != nil {
		return "", "", errors.New("-redis-addr: do not put credentials in the URL (they would show in process listings and logs): use -redis-username and -redis-password-file")
	}
	if (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" {
		return "", "", fmt.Errorf("-redis-addr %q: only scheme://host:port is understood (database 0; no path or options)", raw)
	}
	if u.Hostname() == "" {
		return "", "", fmt.Errorf("-redis-addr %q: no host", raw)
	}
	port := u.Port()
	if port == "" {
		port = "6379"
	}
	return net.JoinHostPort(u.Hostname(), port), u.Scheme, nil
}

// tlsConfig is the TLS configuration of a client of addr.
func (f *Flags) tlsConfig(addr string) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: *f.tlsServerName}
	if cfg.ServerName == "" {
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, fmt.Errorf("-redis-addr %q: %w", addr, err)
		}
		cfg.ServerName = host
	}
	if *f.caFile != "" {
		pem, err := os.ReadFile(*f.caFile)
		if err != nil {
			return nil, fmt.Errorf("read -redis-ca-file: %w", err)
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("-redis-ca-file %s holds no PEM certificate", *f.caFile)
		}
	}
	if (*f.certFile == "") != (*f.keyFile == "") {
		return nil, errors.New("-redis-cert-file and -redis-key-file go together: give both or neither")
	}
	if *f.certFile != "" {
		pair := &keyPair{certFile: *f.certFile, keyFile: *f.keyFile}
		if err := pair.load(); err != nil {
			return nil, err
		}
		cfg.GetClientCertificate = pair.get
	}
	return cfg, nil
}

// keyPair is a client certificate read again at each handshake.
type keyPair struct {
	certFile, keyFile string

	mu   sync.Mutex
	last *tls.Certificate // the last pair that loaded
}

func (k *keyPair) load() error {
	cert, err := tls.LoadX509KeyPair(k.certFile, k.keyFile)
	if err != nil {
		return fmt.Errorf("load the Redis client certificate (-redis-cert-file %s, -redis-key-file %s): %w", k.certFile, k.keyFile, err)
	}
	k.mu.Lock()
	k.last = &cert
	k.mu.Unlock()
	return nil
}

func (k *keyPair) get(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
	if err := k.load(); err != nil {
		slog.Warn("the Redis client certificate did not load again; sending the last good one", "err", err)
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.last, nil
}
