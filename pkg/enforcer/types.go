package enforcer

import (
	"errors"
	"fmt"
	"time"

	"github.com/quotaplane/quotaplane/pkg/policy"
)

// Level names the level of the hierarchy at which a request was denied.
type Level string

// The levels, in the order a request must pass them.
const (
	LevelNone     Level = ""
	LevelGlobal   Level = "global"
	LevelTenant   Level = "tenant"
	LevelEndpoint Level = "endpoint"
	LevelKey      Level = "key"
)

// Levels lists the levels in the order a request passes them.
var Levels = [...]Level{LevelGlobal, LevelTenant, LevelEndpoint, LevelKey}

// globalLevel is LevelGlobal's index in Levels.
const globalLevel = 0

func (l Level) index() int {
	switch l {
	case LevelGlobal:
		return 0
	case LevelTenant:
		return 1
	case LevelEndpoint:
		return 2
	case LevelKey:
		return 3
	}
	return -1
}

// Request is one request to decide. Its cost is the endpoint's cost times
// max(Units, 1).
type Request struct {
	Tenant   string
	Endpoint string
	APIKey   string // empty skips the key level
	// Tier is used only for tenants the plane does not name, when it names one
	// of the plane's tiers; the policy knows the tier of a named tenant.
	Tier  string
	Units int64
}

// Decision is the engine's answer.
type Decision struct {
	Allow bool
	// Level is where the request was denied; LevelNone when allowed.
	Level Level
	// RetryAfter is, on a denial, the earliest wait after which the same
	// request would pass the denying level: never zero, at most MaxRetryAfter.
	RetryAfter time.Duration
	// Reason says why, in words a tenant's engineer understands.
	Reason string
	// Remaining is the tokens left at the tightest level after the decision
	// (on a denial, at the denying level); Bound names that level.
	Remaining int64
	Bound     Level
	// Cost is what the request costs at every level.
	Cost int64
	// Borrowed is how much of the cost came from the burst pool.
	Borrowed int64
	// Upstream and Class are set when the request's endpoint draws on a
	// degraded upstream (upstream.go): the upstream and the tenant's class
	// on it ("critical" … "suspended"). Suspended says the class gets none
	// of it: the surfaces answer 503 with X-Outage-Mode, not 429.
	Upstream  string
	Class     string
	Suspended bool

	// policy is the plane's policy the decision was made under: what
	// Limits and Policy read, so that a surface's headers and labels come
	// from the version that decided, whatever was swapped in since.
	policy *policy.Policy
}

// Same reports whether d and o say the same, whatever policy each was made
// under (two engines' decisions, a decision and its copy over the wire).
func (d *Decision) Same(o *Decision) bool {
	a, b := *d, *o
	a.policy, b.policy = nil, nil
	return a == b
}

// Policy is the plane's policy d was made under (nil for a zero Decision
// and one read from the wire).
func (d *Decision) Policy() *policy.Policy { return d.policy }

// Limits returns the limits r meets at each level (indexed as Levels; nil
// where the level has no limit) under the policy d was made under: what
// the surfaces announce in the RateLimit-Policy header. They are the
// plane's limits, also in the distributed modes, where a node enforces its
// share of them. It allocates nothing.
func (d *Decision) Limits(r *Request) (limits [len(Levels)]*policy.Limit) {
	p := d.policy
	if p == nil {
		return limits
	}
	limits[globalLevel] = &p.Spec().Global
	t, ok := p.Tenant(r.Tenant)
	if !ok {
		if t, ok = p.DefaultTenant(r.Tenant, r.Tier); !ok {
			return limits
		}
	}
	limits[LevelTenant.index()] = t.Limit
	if ep, ok := p.ResolveEndpoint(r.Endpoint); ok {
		limits[LevelEndpoint.index()] = p.EndpointLimit(&t, ep)
	}
	if r.APIKey != "" {
		limits[LevelKey.index()] = p.KeyLimit(&t, r.APIKey)
	}
	return limits
}

// Bounds on requests and answers.
const (
	// MaxUnits bounds Request.Units.
	MaxUnits = 1_000_000
	// MaxRetryAfter caps Decision.RetryAfter, also for requests that can
	// never pass (their cost exceeds a burst).
	MaxRetryAfter = time.Hour
)

// MaxGroup bounds the requests of one DecideAll.
const MaxGroup = 64

// Errors for requests the engine cannot decide. They are wrapped with detail;
// test them with errors.Is.
var (
	ErrInvalidRequest  = errors.New("invalid request")
	ErrUnknownTenant   = errors.New("unknown tenant")
	ErrUnknownEndpoint = errors.New("unknown endpoint")
	ErrClosed          = errors.New("engine closed")
	// ErrKeyNotBound: the plane binds api keys to tenants
	// (policy.Policy.KeyBinding() == "bound") and the request's key is not
	// one of its tenant's keys (or there is none). The error names the
	// tenant and at most the key's policy.ShortKeyHash, never the key.
	ErrKeyNotBound = errors.New("api key not bound to the tenant")
)

// RequestError is the error of DecideAll when one request of the group
// cannot be decided; nothing was decided or debited.
type RequestError struct {
	Index int // the request's index in the group
	Err   error
}

func (e *RequestError) Error() string { return fmt.Sprintf("request %d: %v", e.Index, e.Err) }

func (e *RequestError) Unwrap() error { return e.Err }

// RefusedAt reports whether err is a refusal by the plane, whatever the
// request's quota — a tenant it does not name and denies, an endpoint it
// does not name and denies, an api key that is not the tenant's — and the
// level it names. Every surface answers one as a refusal (403, OVER_LIMIT)
// rather than as an error a gateway's failure mode could let through.
func RefusedAt(err error) (Level, bool) {
	switch {
	case errors.Is(err, ErrUnknownTenant):
		return LevelTenant, true
	case errors.Is(err, ErrUnknownEndpoint):
		return LevelEndpoint, true
	case errors.Is(err, ErrKeyNotBound):
		return LevelKey, true
	}
	return LevelNone, false
}
