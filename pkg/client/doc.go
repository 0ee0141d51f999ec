// Package client is a Go client of an enforcer's decision API (package
// server): one POST /api/{endpoint} per decision over a pool of kept-alive
// connections, optionally with a bearer token and mutual TLS.
//
// A 200 or a 429 is a decision: Decide returns it as the enforcer.Decision
// the enforcer's engine made (allowed or denied, the level, reason and retry
// wait of a denial, the tokens remaining and at which level) and copies the
// answer's quota header fields (package quotaheaders) into the caller's
// header, so a service can pass on exactly what the enforcer said. Every
// other answer is a *StatusError that names the status and the enforcer's
// message and matches ErrBadRequest, ErrUnauthorized, ErrForbidden,
// ErrNotFound or ErrUnavailable with errors.Is.
//
// *Client is a middleware.Decider: middleware.HTTP(client, ...) enforces a
// remote enforcer's decisions in front of a handler.
package client
