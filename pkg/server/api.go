package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/quotaplane/quotaplane/pkg/enforcer"
	"github.com/quotaplane/quotaplane/pkg/quotaheaders"
)

// Request and response header fields: see package quotaheaders.
const (
	HeaderTenant          = quotaheaders.Tenant
	HeaderAPIKey          = quotaheaders.APIKey
	HeaderUnits           = quotaheaders.Units
	HeaderLevel           = quotaheaders.Level
	HeaderReason          = quotaheaders.Reason
	HeaderRateLimitPolicy = quotaheaders.RateLimitPolicy
	HeaderRateLimit       = quotaheaders.RateLimit
)

// MaxBodyBytes bounds a request's body, which a decision does not need.
const MaxBodyBytes = 1 << 20

// API serves decisions from an engine.
type API struct {
	engine  *enforcer.Engine
	metrics *Metrics
}

// NewAPI returns the handler of the decision API; m (which may be nil)
// counts its decisions.
func NewAPI(e *enforcer.Engine, m *Metrics) http.Handler {
	a := &API{engine: e, metrics: m}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /api/{endpoint}", a.decide)
	mux.HandleFunc("POST "+UpstreamReportPath, a.upstreamReport)
	// Forward auth, for any method: gateways ask with GET or the original's.
	mux.HandleFunc(ForwardAuthPath, a.forwardAuth(http.StatusTooManyRequests))
	mux.HandleFunc(AuthRequestPath, a.forwardAuth(http.StatusForbidden))
	mux.HandleFunc("/api/{endpoint}", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Allow", http.MethodPost)
		writeError(w, http.StatusMethodNotAllowed, fmt.Sprintf("method %s is not allowed: decisions are POST /api/{endpoint}", r.Method))
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, fmt.Sprintf("no such path %q: decisions are POST /api/{endpoint}, or forward auth at %s and %s; upstream reports POST %s", r.URL.Path, ForwardAuthPath, AuthRequestPath, UpstreamReportPath))
	})
	return mux
}

// decision is the JSON body of a 200 or 429.
type decision struct {
	Allowed       bool    `json:"allowed"`
	Tenant        string  `json:"tenant"`
	Endpoint      string  `json:"endpoint"`
	Cost          int64   `json:"cost"`
	Remaining     int64   `json:"remaining"`
	Borrowed      int64   `json:"borrowed,omitempty"`
	Level         string  `json:"level,omitempty"`
	Reason        string  `json:"reason,omitempty"`
	RetryAfterSec float64 `json:"retryAfterSeconds,omitempty"`
}

func (a *API) decide(w http.ResponseWriter, r *http.Request) {
	req, problem := parseRequest(r)
	if problem != "" {
		writeError(w, http.StatusBadRequest, problem)
		return
	}
	if r.Body == http.NoBody {
		// The usual decision: nothing to read.
	} else if n, err := io.Copy(io.Discard, http.MaxBytesReader(w, r.Body, MaxBodyBytes)); err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("request body is larger than %d bytes; a decision needs no body", MaxBodyBytes))
			return
		}
		writeError(w, http.StatusBadRequest, fmt.Sprintf("reading the body after %d bytes: %v", n, err))
		return
	}
	start := time.Now()
	d, err := a.engine.Decide(r.Context(), req)
	if err != nil {
		writeEngineError(w, err)
		return
	}
	a.metrics.Observe(&req, &d, time.Since(start))
	body := decision{Allowed: d.Allow, Tenant: req.Tenant, Endpoint: req.Endpoint, Cost: d.Cost, Remaining: d.Remaining, Borrowed: d.Borrowed}
	limits := d.Limits(&req)
	quotaheaders.Set(w.Header(), &limits, &d)
	status := http.StatusOK
	if !d.Allow {
		status = quotaheaders.Status(&d)
		body.Level, body.Reason, body.RetryAfterSec = string(d.Level), d.Reason, d.RetryAfter.Seconds()
	}
	writeDecision(w, status, &body)
}

// parseRequest reads the decision request from the path and headers; a
// non-empty problem says what is wrong with it.
func parseRequest(r *http.Request) (req enforcer.Request, problem string) {
	req, problem = parseCaller(r.Header)
	req.Endpoint = r.PathValue("endpoint")
	return req, problem
}

// parseCaller reads who a request is for from its header fields: the
// tenant, the api key and the units, as both the decision API and forward
// auth take them; a non-empty problem says what is wrong with them. What
// makes a name valid is the engine's to say (enforcer.ValidateRequest,
// which Decide calls first: a 400 that names the rule).
func parseCaller(h http.Header) (req enforcer.Request, problem string) {
	tenants, keys := h[HeaderTenant], h[HeaderAPIKey]
	if len(tenants) > 0 {
		req.Tenant = tenants[0]
	}
	if len(keys) > 0 {
		req.APIKey = keys[0]
	}
	switch {
	case req.Tenant == "":
		return req, "missing " + HeaderTenant + " header: name the tenant this request is for"
	case req.APIKey == "":
		return req, "missing " + HeaderAPIKey + " header: name the api key this request uses"
	case len(tenants) > 1 || len(keys) > 1:
		return req, fmt.Sprintf("send %s and %s once each", HeaderTenant, HeaderAPIKey)
	}
	if units := h[HeaderUnits]; len(units) > 0 {
		v := units[0]
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 1 || n > enforcer.MaxUnits || len(units) > 1 {
			return req, fmt.Sprintf("%s must be a whole number from 1 to %d, sent once, not %q", HeaderUnits, enforcer.MaxUnits, v)
		}
		req.Units = n
	}
	return req, ""
}

// writeEngineError answers a request the engine did not decide; a
// refusal by the plane names its level in X-Quota-Level and says why in
// X-Quota-Reason, without Retry-After: retrying will not help.
func writeEngineError(w http.ResponseWriter, err error) {
	status, level, message := engineRefusal(err)
	if level != enforcer.LevelNone {
		writeRefusal(w, status, level, message)
		return
	}
	writeError(w, status, message)
}

// engineRefusal maps an error of the engine's to a status, the level a
// refusal by the plane names (LevelNone for every other error) and a message.
func engineRefusal(err error) (status int, level enforcer.Level, message string) {
	switch {
	case errors.Is(err, enforcer.ErrInvalidRequest):
		return http.StatusBadRequest, enforcer.LevelNone, err.Error()
	case errors.Is(err, enforcer.ErrUnknownTenant):
		return http.StatusForbidden, enforcer.LevelTenant, err.Error()
	case errors.Is(err, enforcer.ErrKeyNotBound):
		return http.StatusForbidden, enforcer.LevelKey, err.Error()
	case errors.Is(err, enforcer.ErrUnknownEndpoint):
		return http.StatusNotFound, enforcer.LevelNone, err.Error()
	case errors.Is(err, enforcer.ErrClosed):
		return http.StatusServiceUnavailable, enforcer.LevelNone, "the enforcer is shutting down; retry on another instance"
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return http.StatusServiceUnavailable, enforcer.LevelNone, "the request ended before a decision: " + err.Error()
	default:
		return http.StatusInternalServerError, enforcer.LevelNone, err.Error()
	}
}

func writeError(w http.ResponseWriter, status int, message string) {
	writeJSON(w, status, struct {
		Error string `json:"error"`
	}{message})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	setJSONHeaders(w.Header())
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// setJSONHeaders marks an answer as JSON not to be cached. The values are
// shared by every answer (net/http only reads them): no allocation.
func setJSONHeaders(h http.Header) {
	h["Content-Type"], h["Cache-Control"] = contentTypeJSON, cacheControlNoStore
}

var contentTypeJSON, cacheControlNoStore = []string{"application/json"}, []string{"no-store"}

// writeDecision writes a decision's body as writeJSON would, formatted by
// hand into a pooled buffer: the decision API's every answer.
func writeDecision(w http.ResponseWriter, status int, d *decision) {
	buf := bodyBuffers.Get().(*[]byte)
	defer bodyBuffers.Put(buf)
	b := append((*buf)[:0], `{"allowed":`...)
	b = strconv.AppendBool(b, d.Allowed)
	b = append(b, `,"tenant":`...)
	b = appendJSONString(b, d.Tenant)
	b = append(b, `,"endpoint":`...)
	b = appendJSONString(b, d.Endpoint)
	b = append(b, `,"cost":`...)
	b = strconv.AppendInt(b, d.Cost, 10)
	b = append(b, `,"remaining":`...)
	b = strconv.AppendInt(b, d.Remaining, 10)
	if d.Borrowed != 0 {
		b = append(b, `,"borrowed":`...)
		b = strconv.AppendInt(b, d.Borrowed, 10)
	}
	if d.Level != "" {
		b = append(b, `,"level":`...)
		b = appendJSONString(b, d.Level)
	}
	if d.Reason != "" {
		b = append(b, `,"reason":`...)
		b = appendJSONString(b, d.Reason)
	}
	if d.RetryAfterSec != 0 {
		b = append(b, `,"retryAfterSeconds":`...)
		b = appendJSONFloat(b, d.RetryAfterSec)
	}
	b = append(b, "}\n"...)
	setJSONHeaders(w.Header())
	w.WriteHeader(status)
	_, _ = w.Write(b)
	if cap(b) <= maxPooledBody {
		*buf = b
	}
}

// bodyBuffers hold decision bodies while they are written; one that grew
// past maxPooledBody (a long reason) is not kept.
var bodyBuffers = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}

const maxPooledBody = 4096

// appendJSONFloat appends f as encoding/json writes a float64: plain
// decimals from 1e-6 up to 1e21, else an exponent without a leading zero
// (1e-07 is 1e-7).
func appendJSONFloat(b []byte, f float64) []byte {
	if abs := math.Abs(f); abs != 0 && (abs < 1e-6 || abs >= 1e21) {
		from := len(b)
		b = strconv.AppendFloat(b, f, 'e', -1, 64)
		if n := len(b); n-from >= 4 && b[n-4] == 'e' && b[n-3] == '-' && b[n-2] == '0' {
			b[n-2] = b[n-1]
			b = b[:n-1]
		}
		return b
	}
	return strconv.AppendFloat(b, f, 'f', -1, 64)
}

// appendJSONString appends s as a JSON string, escaped as encoding/json
// escapes it (quotes, backslashes, control bytes, and <, >, & for HTML;
// invalid UTF-8 as U+FFFD).
func appendJSONString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	start := 0 // s[start:i] needs no escaping: appended as one run
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf && c >= 0x20 && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&' {
			i++
			continue
		}
		if c >= utf8.RuneSelf {
			r, size := utf8.DecodeRuneInString(s[i:])
			if r != utf8.RuneError && r != '\u2028' && r != '\u2029' || size > 1 && r == utf8.RuneError {
				i += size // valid UTF-8 goes as it is
				continue
			}
			b = append(b, s[start:i]...)
			if r == utf8.RuneError {
				b = append(b, `\ufffd`...)
			} else {
				b = append(b, `\u202`...)
				b = append(b, hex[r&0xf])
			}
			i += size
			start = i
			continue
		}
		b = append(b, s[start:i]...)
		switch c {
		case '"', '\\':
			b = append(b, '\\', c)
		case '\b':
			b = append(b, `\b`...)
		case '\f':
			b = append(b, `\f`...)
		case '\n':
			b = append(b, `\n`...)
		case '\r':
			b = append(b, `\r`...)
		case '\t':
			b = append(b, `\t`...)
		default:
			b = append(b, `\u00`...)
			b = append(b, hex[c>>4], hex[c&0xf])
		}
		i++
		start = i
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

// UpstreamReportPath takes passive reports of calls to upstreams (seed
// 004's sensing from the data path): a JSON body {"calls": [{"upstream":
// "llm", "status": 200, "latencyMs": 123.4, "count": 1, "remaining": 40,
// "limit": 100}, …]}, at most MaxUpstreamCalls calls; status 0 is a call
// that got no answer; count, remaining and limit are optional. 202 when
// taken, 400 saying what is wrong otherwise (nothing is taken).
const UpstreamReportPath = "/quota/upstream/report"

// MaxUpstreamCalls bounds the calls of one report.
const MaxUpstreamCalls = 1000

type upstreamReport struct {
	Calls []struct {
		Upstream  string  `json:"upstream"`
		Status    int     `json:"status"`
		LatencyMs float64 `json:"latencyMs"`
		Count     int     `json:"count"`
		Remaining int64   `json:"remaining"`
		Limit     int64   `json:"limit"`
	} `json:"calls"`
}

func (a *API) upstreamReport(w http.ResponseWriter, r *http.Request) {
	var rep upstreamReport
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&rep); err != nil {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("the body must be JSON {\"calls\": [{\"upstream\", \"status\", \"latencyMs\", \"count\", \"remaining\", \"limit\"}]}: %v", err))
		return
	}
	if len(rep.Calls) == 0 || len(rep.Calls) > MaxUpstreamCalls {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("a report holds 1 to %d calls, not %d", MaxUpstreamCalls, len(rep.Calls)))
		return
	}
	calls := make([]enforcer.UpstreamCall, len(rep.Calls))
	for i, c := range rep.Calls {
		if !(c.LatencyMs >= 0 && c.LatencyMs <= float64(time.Hour/time.Millisecond)) {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("call %d: latencyMs %v out of range [0, 3600000]", i, c.LatencyMs))
			return
		}
		calls[i] = enforcer.UpstreamCall{Upstream: c.Upstream, Status: c.Status, Latency: time.Duration(c.LatencyMs * float64(time.Millisecond)),
			Count: c.Count, Remaining: c.Remaining, Limit: c.Limit}
	}
	if err := a.engine.ReportUpstream(calls); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	writeJSON(w, http.StatusAccepted, struct {
		Accepted int `json:"accepted"`
	}{len(calls)})
}
