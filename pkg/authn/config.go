package authn

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// Config is how one listener authenticates its callers. The zero value
// serves plain text to anyone.
type Config struct {
	// CertFile and KeyFile are the listener's certificate (chain) and key,
	// PEM: set both to serve TLS.
	CertFile, KeyFile string
	// ClientCAFile is a PEM bundle of the CAs that sign callers' client
	// certificates: set it (with CertFile and KeyFile) to require mTLS.
	ClientCAFile string
	// TokenFile holds the bearer tokens callers must send, one per line.
	TokenFile string
}

// Enabled reports whether c asks for anything: TLS or authentication.
func (c Config) Enabled() bool { return c != Config{} }

// Authenticates reports whether c authenticates callers (mTLS or a token);
// TLS alone does not.
func (c Config) Authenticates() bool { return c.ClientCAFile != "" || c.TokenFile != "" }

// Mode names what c does, for logs: "none", "tls", "mtls", "token",
// "tls+token" or "mtls+token".
func (c Config) Mode() string {
	mode := ""
	switch {
	case c.ClientCAFile != "":
		mode = "mtls"
	case c.CertFile != "":
		mode = "tls"
	}
	if c.TokenFile != "" {
		if mode != "" {
			mode += "+"
		}
		mode += "token"
	}
	if mode == "" {
		return "none"
	}
	return mode
}

// Validate says what is missing from c; flag names are the caller's to add.
func (c Config) Validate() error {
	switch {
	case (c.CertFile == "") != (c.KeyFile == ""):
		return errors.New("a certificate needs its key and a key its certificate: set both files or neither")
	case c.ClientCAFile != "" && c.CertFile == "":
		return errors.New("a client CA needs TLS: set the certificate and key files too")
	}
	return nil
}

// ServerTLS is the listener's TLS configuration, or nil when c serves
// plain text. The certificate and the client CAs are read again when their
// files change (see the package doc); with ClientCAFile every handshake
// must present a client certificate that chains to one of its CAs.
func (c Config) ServerTLS(opts ...Option) (*tls.Config, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if c.CertFile == "" {
		return nil, nil
	}
	o := newOptions(opts)
	cert, err := newWatched([]string{c.CertFile, c.KeyFile}, func(raw [][]byte) (tls.Certificate, error) {
		kp, err := tls.X509KeyPair(raw[0], raw[1])
		if err != nil {
			return kp, fmt.Errorf("certificate %s and key %s: %w", c.CertFile, c.KeyFile, err)
		}
		return kp, nil
	}, o)
	if err != nil {
		return nil, err
	}
	base := &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: []string{"h2", "http/1.1"},
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return cert.get(), nil
		},
	}
	if c.ClientCAFile == "" {
		return base, nil
	}
	// The configuration a handshake uses is made once per CA bundle read,
	// not once per handshake.
	perBundle, err := newWatched([]string{c.ClientCAFile}, func(raw [][]byte) (*tls.Config, error) {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(raw[0]) {
			return nil, fmt.Errorf("client CA file %s holds no PEM certificate", c.ClientCAFile)
		}
		cfg := base.Clone()
		cfg.GetConfigForClient = nil
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
		cfg.ClientCAs = pool
		return cfg, nil
	}, o)
	if err != nil {
		return nil, err
	}
	first := *perBundle.get()
	base.ClientAuth, base.ClientCAs = tls.RequireAndVerifyClientCert, first.ClientCAs
	base.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
		return *perBundle.get(), nil
	}
	return base, nil
}

// Tokens is the checker of TokenFile, or nil when c names none.
func (c Config) Tokens(opts ...Option) (*Tokens, error) {
	if c.TokenFile == "" {
		return nil, nil
	}
	return NewTokenChecker(c.TokenFile, opts...)
}

// GRPCServerOptions are the options that make a gRPC server authenticate
// as c says: TLS credentials, and interceptors that check the bearer token
// of every call.
func (c Config) GRPCServerOptions(opts ...Option) ([]grpc.ServerOption, error) {
	tlsConfig, err := c.ServerTLS(opts...)
	if err != nil {
		return nil, err
	}
	tokens, err := c.Tokens(opts...)
	if err != nil {
		return nil, err
	}
	var out []grpc.ServerOption
	if tlsConfig != nil {
		out = append(out, grpc.Creds(credentials.NewTLS(tlsConfig)))
	}
	if tokens != nil {
		out = append(out, grpc.ChainUnaryInterceptor(tokens.UnaryServerInterceptor()),
			grpc.ChainStreamInterceptor(tokens.StreamServerInterceptor()))
	}
	return out, nil
}
