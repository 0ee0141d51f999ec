package middleware

import (
	"encoding/json"
	"net/http"

	"github.com/quotaplane/quotaplane/pkg/enforcer"
	"github.com/quotaplane/quotaplane/pkg/quotaheaders"
)

// HTTP returns middleware that decides each request before next sees it.
// identify names the request's tenant, endpoint, api key and units (from
// its authenticated identity, its route); an error from it is a 400 whose
// body is the error's message.
//
//   - allowed: next serves the request; the response carries RateLimit-Policy
//     and RateLimit.
//   - denied: 429 with Retry-After, X-Quota-Level, X-Quota-Reason,
//     RateLimit-Policy, RateLimit and a small JSON body; next is not called.
//   - refused by the plane (a tenant or endpoint it denies, an api key that is
//     not the tenant's): 403 with the plane's message, in the body and in
//     X-Quota-Reason, and the level it names in X-Quota-Level (tenant,
//     endpoint or key); no Retry-After: retrying will not help.
//   - the decider failed: 503 with Retry-After: 1 (FailClosed, the default),
//     or next serves the request (FailOpen).
//
// Every body the middleware writes is JSON: {"error": "..."} or, for a 429,
// the decision.
func HTTP(d Decider, identify func(*http.Request) (enforcer.Request, error), opts ...Option) func(http.Handler) http.Handler {
	s := newSettings(opts)
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			req, err := identify(r)
			if err != nil {
				writeError(w, http.StatusBadRequest, err.Error())
				return
			}
			dec, err := d.Decide(r.Context(), req, w.Header())
			if err != nil {
				switch outcome, level := classify(err); outcome {
				case invalid:
					writeError(w, http.StatusBadRequest, message(err))
				case refused:
					msg := message(err)
					if level != enforcer.LevelNone {
						w.Header().Set("X-Quota-Level", string(level))
					}
					w.Header().Set("X-Quota-Reason", quotaheaders.Text(msg, quotaheaders.MaxReasonBytes))
					writeError(w, http.StatusForbidden, msg)
				default:
					s.failure(r.Context(), err)
					if s.failureMode == FailOpen {
						next.ServeHTTP(w, r)
						return
					}
					w.Header().Set("Retry-After", "1")
					writeError(w, http.StatusServiceUnavailable, "the quota check failed, so the request was not served; retry shortly")
				}
				return
			}
			if !dec.Allow {
				writeDenial(w, &req, &dec)
				return
			}
			next.ServeHTTP(w, r)
		})
	}
}

// denial is the JSON body of a 429: the decision API's, so clients read
// both alike.
type denial struct {
	Allowed       bool    `json:"allowed"`
	Tenant        string  `json:"tenant"`
	Endpoint      string  `json:"endpoint"`
	Cost          int64   `json:"cost"`
	Remaining     int64   `json:"remaining"`
	Level         string  `json:"level"`
	Reason        string  `json:"reason"`
	RetryAfterSec float64 `json:"retryAfterSeconds"`
}

func writeDenial(w http.ResponseWriter, r *enforcer.Request, d *enforcer.Decision) {
	writeJSON(w, quotaheaders.Status(d), denial{
		Tenant: r.Tenant, Endpoint: r.Endpoint, Cost: d.Cost, Remaining: max(d.Remaining, 0),
		Level: string(d.Level), Reason: d.Reason, RetryAfterSec: d.RetryAfter.Seconds(),
	})
}

func writeError(w http.ResponseWriter, status int, message string) {
	writeJSON(w, status, struct {
		Error string `json:"error"`
	}{message})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil { // only strings and numbers: cannot happen
		status, body = http.StatusInternalServerError, []byte(`{"error":"encoding the answer failed"}`)
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(append(body, '\n'))
}
