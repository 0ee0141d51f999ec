package middleware

import (
	"context"
	"errors"
	"net/http"

	"github.com/quotaplane/quotaplane/pkg/client"
	"github.com/quotaplane/quotaplane/pkg/enforcer"
	"github.com/quotaplane/quotaplane/pkg/quotaheaders"
)

// Decider decides requests: an engine in this process (Local) or a remote
// enforcer (*client.Client).
type Decider interface {
	// Decide decides r. When it returns a decision and header is not nil, it
	// sets the decision's quota header fields in header (package
	// quotaheaders: RateLimit-Policy, RateLimit, and on a denial Retry-After,
	// X-Quota-Level, X-Quota-Reason); when it returns an error it sets none.
	Decide(ctx context.Context, r enforcer.Request, header http.Header) (enforcer.Decision, error)
}

// Local is a Decider over an engine in this process.
func Local(e *enforcer.Engine) Decider { return localDecider{engine: e} }

type localDecider struct{ engine *enforcer.Engine }

func (l localDecider) Decide(ctx context.Context, r enforcer.Request, header http.Header) (enforcer.Decision, error) {
	d, err := l.engine.Decide(ctx, r)
	if err != nil || header == nil {
		return d, err
	}
	limits := d.Limits(&r)
	quotaheaders.Set(header, &limits, &d)
	return d, nil
}

// Make sure both deciders stay deciders.
var (
	_ Decider = localDecider{}
	_ Decider = (*client.Client)(nil)
)

// outcome is what a decider's error means for the request.
type outcome int

const (
	// failed: the decider could not decide (the enforcer is unreachable,
	// closed, timed out, refused this service's credentials); the
	// FailureMode applies.
	failed outcome = iota
	// invalid: the request as identified cannot be decided (a name that is
	// not one, units out of range): the caller's mistake.
	invalid
	// refused: the plane refuses the request whatever its quota: a tenant or
	// endpoint it does not name and denies, an api key that is not the
	// tenant's.
	refused
)

// refusal is an error that means refused and the level it names.
type refusal struct {
	err   error
	level enforcer.Level
}

// refusals are a remote enforcer's answers that mean refused (a local
// engine's are enforcer.RefusedAt's). A remote refusal names its level in
// X-Quota-Level (StatusError.Level).
var refusals = [...]refusal{
	{client.ErrForbidden, enforcer.LevelNone},
	{client.ErrNotFound, enforcer.LevelEndpoint},
}

// invalids are the errors that mean invalid.
var invalids = [...]error{enforcer.ErrInvalidRequest, client.ErrBadRequest}

// classify says what err means and, for a refusal, the level it names
// (LevelNone when it names none).
func classify(err error) (outcome, enforcer.Level) {
	if level, ok := enforcer.RefusedAt(err); ok {
		return refused, level
	}
	for _, r := range refusals {
		if errors.Is(err, r.err) {
			var answer *client.StatusError
			if errors.As(err, &answer) && answer.Level != enforcer.LevelNone {
				return refused, answer.Level
			}
			return refused, r.level
		}
	}
	for _, target := range invalids {
		if errors.Is(err, target) {
			return invalid, enforcer.LevelNone
		}
	}
	return failed, enforcer.LevelNone
}

// message is what an error says to the caller of a refused or invalid
// request: a remote enforcer's own words rather than the client's wrapping.
func message(err error) string {
	var answer *client.StatusError
	if errors.As(err, &answer) {
		return answer.Message
	}
	return err.Error()
}
