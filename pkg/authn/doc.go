// Package authn authenticates the callers of the enforcer's decision
// surfaces — the HTTP decision API and the gRPC server of Envoy's rate
// limit service and external authorization — per listener. A decision
// debits a tenant's quota, so whoever can ask for one can spend (or, by
// naming another tenant, exhaust) someone's quota: in a cluster where more
// than the gateway can reach the enforcer, require one of these.
//
// Two mechanisms, alone or together (a caller must then pass both):
//
//   - mTLS (Config.CertFile, KeyFile and ClientCAFile): the listener serves
//     TLS with CertFile/KeyFile and requires a client certificate that
//     chains to a CA in ClientCAFile (tls.RequireAndVerifyClientCert). Use it
//     where the gateway holds a client certificate: inside a service mesh,
//     or Envoy's rate limit and ext_authz clusters with an
//     UpstreamTlsContext transport_socket carrying a tls_certificate. Every
//     certificate a CA in ClientCAFile signed is accepted; give the
//     enforcer's callers a CA of their own.
//   - A bearer token (Config.TokenFile): every request carries
//     "Authorization: Bearer <token>" (gRPC: the "authorization" metadata).
//     Use it where the gateway can add a header but holds no client
//     certificate: Caddy's forward_auth (header_up) or nginx auth_request
//     (proxy_set_header), and Envoy's grpc_service initial_metadata. Send it
//     over TLS (CertFile/KeyFile without ClientCAFile) unless the network
//     path is private.
//
// CertFile and KeyFile alone serve TLS without authenticating anyone.
//
// Files are Kubernetes Secret mounts: each is read again when it changes,
// at most once per recheck interval (1 s by default) and only when a
// handshake or request needs it, so a rotated certificate, CA bundle or
// token takes effect without a restart. A file that turns unreadable or
// invalid keeps the last good contents in force (and the problem is
// logged). A token file holds one token per line, so that rotation can
// overlap: add the new token, roll the callers, remove the old one. Tokens
// are compared in constant time, by their SHA-256 digests, so neither their
// contents nor their lengths leak through timing.
//
// Failures are answered like the surface's other errors: HTTP 401 with
// WWW-Authenticate: Bearer and a JSON body {"error": "..."}; gRPC
// codes.Unauthenticated; a missing or untrusted client certificate fails
// the TLS handshake. Health and reflection on an authenticated gRPC
// listener are authenticated too; probes use the admin listener.
package authn
