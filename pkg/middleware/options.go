package middleware

import "context"

// FailureMode says what happens to a request when the decider fails: the
// enforcer is unreachable, shutting down, too slow for the request's
// context, or refuses this service's credentials. Refusals by the plane
// (unknown tenants, keys that are not the tenant's) are decisions, not
// failures: they are refused in either mode.
type FailureMode int

const (
	// FailClosed refuses the request: HTTP 503, gRPC Unavailable. The default.
	FailClosed FailureMode = iota
	// FailOpen serves the request as if it were allowed, without quota
	// header fields.
	FailOpen
)

func (m FailureMode) String() string {
	switch m {
	case FailClosed:
		return "closed"
	case FailOpen:
		return "open"
	}
	return "FailureMode(?)"
}

type settings struct {
	failureMode FailureMode
	onFailure   func(ctx context.Context, err error)
}

// Option configures a middleware or an interceptor.
type Option func(*settings)

// WithFailureMode sets what happens when the decider fails (default FailClosed).
func WithFailureMode(m FailureMode) Option { return func(s *settings) { s.failureMode = m } }

// WithOnFailure calls f with each decider failure, before the failure mode
// applies: to log or count them, which matters most when failing open.
// f runs on the request's goroutine.
func WithOnFailure(f func(ctx context.Context, err error)) Option {
	return func(s *settings) { s.onFailure = f }
}

func newSettings(opts []Option) settings {
	var s settings
	for _, opt := range opts {
		opt(&s)
	}
	return s
}

func (s *settings) failure(ctx context.Context, err error) {
	if s.onFailure != nil {
		s.onFailure(ctx, err)
	}
}
