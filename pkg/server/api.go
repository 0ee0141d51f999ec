package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/quotaplane/quotaplane/pkg/enforcer"
	"github.com/quotaplane/quotaplane/pkg/policy"
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
	mux.HandleFunc("/api/{endpoint}", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Allow", http.MethodPost)
		writeError(w, http.StatusMethodNotAllowed, fmt.Sprintf("method %s is not allowed: decisions are POST /api/{endpoint}", r.Method))
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, fmt.Sprintf("no such path %q: decisions are POST /api/{endpoint}", r.URL.Path))
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
	if n, err := io.Copy(io.Discard, http.MaxBytesReader(w, r.Body, MaxBodyBytes)); err != nil {
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
	a.metrics.observe(a.engine, req.Tenant, d, time.Since(start))
	body := decision{Allowed: d.Allow, Tenant: req.Tenant, Endpoint: req.Endpoint, Cost: d.Cost, Remaining: d.Remaining, Borrowed: d.Borrowed}
	limits := a.engine.LimitsFor(&req)
	quotaheaders.Set(w.Header(), &limits, &d)
	status := http.StatusOK
	if !d.Allow {
		status = http.StatusTooManyRequests
		body.Level, body.Reason, body.RetryAfterSec = string(d.Level), d.Reason, d.RetryAfter.Seconds()
	}
	writeJSON(w, status, body)
}

// RetryAfterSeconds is quotaheaders.RetryAfterSeconds.
func RetryAfterSeconds(d time.Duration) int64 { return quotaheaders.RetryAfterSeconds(d) }

// parseRequest reads the decision request from the path and headers; a
// non-empty problem says what is wrong with it.
func parseRequest(r *http.Request) (req enforcer.Request, problem string) {
	req.Endpoint = r.PathValue("endpoint")
	req.Tenant = r.Header.Get(HeaderTenant)
	req.APIKey = r.Header.Get(HeaderAPIKey)
	switch {
	case req.Tenant == "":
		return req, "missing " + HeaderTenant + " header: name the tenant this request is for"
	case req.APIKey == "":
		return req, "missing " + HeaderAPIKey + " header: name the api key this request uses"
	case !policy.ValidName(req.Tenant):
		return req, fmt.Sprintf("%s must be 1 to %d printable ASCII characters without spaces", HeaderTenant, policy.MaxNameBytes)
	case !policy.ValidName(req.APIKey):
		return req, fmt.Sprintf("%s must be 1 to %d printable ASCII characters without spaces", HeaderAPIKey, policy.MaxNameBytes)
	case len(r.Header.Values(HeaderTenant)) > 1 || len(r.Header.Values(HeaderAPIKey)) > 1:
		return req, fmt.Sprintf("send %s and %s once each", HeaderTenant, HeaderAPIKey)
	}
	if v := r.Header.Get(HeaderUnits); v != "" {
		units, err := strconv.ParseInt(v, 10, 64)
		if err != nil || units < 1 || units > enforcer.MaxUnits {
			return req, fmt.Sprintf("%s must be a whole number from 1 to %d, not %q", HeaderUnits, enforcer.MaxUnits, v)
		}
		req.Units = units
	}
	return req, ""
}

func writeEngineError(w http.ResponseWriter, err error) {
	switch {
	case errors.Is(err, enforcer.ErrInvalidRequest):
		writeError(w, http.StatusBadRequest, err.Error())
	case errors.Is(err, enforcer.ErrUnknownTenant):
		writeError(w, http.StatusForbidden, err.Error())
	case errors.Is(err, enforcer.ErrUnknownEndpoint):
		writeError(w, http.StatusNotFound, err.Error())
	case errors.Is(err, enforcer.ErrClosed):
		writeError(w, http.StatusServiceUnavailable, "the enforcer is shutting down; retry on another instance")
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		writeError(w, http.StatusServiceUnavailable, "the request ended before a decision: "+err.Error())
	default:
		writeError(w, http.StatusInternalServerError, err.Error())
	}
}

func writeError(w http.ResponseWriter, status int, message string) {
	writeJSON(w, status, struct {
		Error string `json:"error"`
	}{message})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
