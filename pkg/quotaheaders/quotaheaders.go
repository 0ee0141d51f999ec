// Package quotaheaders writes a decision as the HTTP header fields every
// quotaplane surface returns: the decision API, forward auth, Envoy's rate
// limit service and external authorization (as response_headers_to_add and a
// denied response's headers), and the in-process middleware. One function
// builds them, so every surface says the same thing.
//
// While the request's endpoint draws on a degraded upstream (seed 004), also
// X-Outage-Mode: true and X-Tier, the tenant's priority class on it; a
// class the upstream's phase suspends is answered 503 (Status), not 429.
//
// On every answer: RateLimit-Policy, the limits in force for the request,
// one item per level (q tokens per w seconds), and RateLimit, the level that
// bounds the answer (r tokens remaining, t seconds until a retry passes or,
// when allowed, until that level is full again): the IETF httpapi ratelimit
// header fields. On a denial also Retry-After (whole seconds, rounded up,
// at least 1), X-Quota-Level (global|tenant|endpoint|key, or upstream for a
// degraded upstream's gate) and X-Quota-Reason.
package quotaheaders

import (
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/quotaplane/quotaplane/pkg/enforcer"
	"github.com/quotaplane/quotaplane/pkg/policy"
)

// Request header fields: who a request is for.
const (
	Tenant = "X-Tenant"
	APIKey = "X-Api-Key"
	Units  = "X-Quota-Units"
)

// Response header fields.
const (
	RetryAfter      = "Retry-After"
	Level           = "X-Quota-Level"
	Reason          = "X-Quota-Reason"
	RateLimitPolicy = "RateLimit-Policy"
	RateLimit       = "RateLimit"
	OutageMode      = "X-Outage-Mode"
	Tier            = "X-Tier"
)

// Status is the HTTP status of a denial: 503 for a tenant its degraded
// upstream suspends (seed 004), else 429.
func Status(d *enforcer.Decision) int {
	if d.Suspended {
		return http.StatusServiceUnavailable
	}
	return http.StatusTooManyRequests
}

// Each calls add with every response header field of decision d, made
// under limits (enforcer.Decision.Limits), in a fixed order. The values it
// formats share one string: one allocation an answer.
func Each(limits *[len(enforcer.Levels)]*policy.Limit, d *enforcer.Decision, add func(name, value string)) {
	var buf [320]byte
	b := buf[:0]
	// fields are the answer's, in order: a value formatted into b (from,
	// to), or given (value, from -1).
	var fields [maxFields]struct {
		name, value string
		from, to    int
	}
	n := 0
	formatted := func(name string, from int) {
		fields[n].name, fields[n].from, fields[n].to = name, from, len(b)
		n++
	}
	given := func(name, value string) {
		fields[n].name, fields[n].value, fields[n].from = name, value, -1
		n++
	}
	var bound *policy.Limit
	for i, l := range limits {
		if l == nil {
			continue
		}
		level := enforcer.Levels[i]
		if level == d.Bound {
			bound = l
		}
		if len(b) > 0 {
			b = append(b, ", "...)
		}
		b = append(b, '"')
		b = append(b, level...)
		b = append(b, `";q=`...)
		b = strconv.AppendInt(b, l.Rate, 10)
		b = append(b, ";w="...)
		b = strconv.AppendInt(b, int64(math.Ceil(l.Period.Seconds())), 10)
	}
	if len(b) > 0 {
		formatted(RateLimitPolicy, 0)
	}
	if bound != nil {
		var t int64
		switch {
		case !d.Allow:
			t = RetryAfterSeconds(d.RetryAfter)
		case bound.Algorithm == policy.SlidingWindow || bound.Rate == 0:
			t = int64(math.Ceil(bound.Period.Seconds()))
		default: // until the bucket is full again, at its rate
			t = int64(math.Ceil(float64(max(bound.Burst-d.Remaining, 0)) * bound.Period.Seconds() / float64(bound.Rate)))
		}
		from := len(b)
		b = append(b, '"')
		b = append(b, d.Bound...)
		b = append(b, `";r=`...)
		b = strconv.AppendInt(b, max(d.Remaining, 0), 10)
		b = append(b, ";t="...)
		b = strconv.AppendInt(b, t, 10)
		formatted(RateLimit, from)
	}
	if !d.Allow {
		from := len(b)
		b = strconv.AppendInt(b, RetryAfterSeconds(d.RetryAfter), 10)
		formatted(RetryAfter, from)
		given(Level, string(d.Level))
		given(Reason, d.Reason)
	}
	if d.Class != "" {
		given(OutageMode, "true")
		given(Tier, d.Class)
	}
	values := string(b)
	for _, f := range fields[:n] {
		if f.from >= 0 {
			f.value = values[f.from:f.to]
		}
		add(f.name, f.value)
	}
}

// maxFields is the most fields an answer has.
const maxFields = 7

// Set sets the fields of Each on h. Their values share one slice: one
// allocation more an answer, whatever the number of fields.
func Set(h http.Header, limits *[len(enforcer.Levels)]*policy.Limit, d *enforcer.Decision) {
	var values []string
	Each(limits, d, func(name, value string) {
		if values == nil {
			values = make([]string, 0, maxFields)
		}
		values = append(values, value)
		h[canonical[name]] = values[len(values)-1 : len(values) : len(values)]
	})
}

// canonical holds the names of Each in http.Header's spelling, so that Set
// does not make it again on every answer (RateLimit becomes Ratelimit).
var canonical = map[string]string{}

func init() {
	for _, name := range []string{RetryAfter, Level, Reason, RateLimitPolicy, RateLimit, OutageMode, Tier} {
		canonical[name] = http.CanonicalHeaderKey(name)
	}
}

// MaxReasonBytes bounds X-Quota-Reason on a refusal, whose message may
// quote what the request sent.
const MaxReasonBytes = 512

// Text is s as a header field value: at most max bytes, every byte that is
// not printable ASCII replaced by '?'. Messages quote what requests sent; a
// header field carries no control bytes, and gateways differ on what they
// do with other bytes.
func Text(s string, max int) string {
	clean := len(s) <= max
	for i := 0; clean && i < len(s); i++ {
		clean = s[i] >= 0x20 && s[i] <= 0x7e
	}
	if clean {
		return s
	}
	b := []byte(s[:min(len(s), max)])
	for i, c := range b {
		if c < 0x20 || c > 0x7e {
			b[i] = '?'
		}
	}
	return string(b)
}

// RetryAfterSeconds is the Retry-After value for a wait: whole seconds,
// rounded up, at least 1.
func RetryAfterSeconds(d time.Duration) int64 {
	return max(int64(math.Ceil(d.Seconds())), 1)
}
