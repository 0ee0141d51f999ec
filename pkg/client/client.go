package client

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/quotaplane/quotaplane/pkg/enforcer"
	"github.com/quotaplane/quotaplane/pkg/quotaheaders"
)

// Defaults of the client's pooled transport.
const (
	// DefaultTimeout bounds one decision, connection included, unless the
	// caller's context ends first.
	DefaultTimeout = 2 * time.Second
	// DefaultMaxIdleConns is the pool's size. Every decision goes to the same
	// host, so this is also the per-host bound: net/http's default of 2 idle
	// connections per host would close and redial under any concurrency.
	DefaultMaxIdleConns = 256
	dialTimeout         = time.Second
	idleConnTimeout     = 90 * time.Second
	// maxBodyBytes bounds the answer read: a decision's body is ~200 bytes,
	// an error's a line.
	maxBodyBytes = 64 << 10
)

// Errors for answers that are not decisions, by HTTP status; a *StatusError
// matches them with errors.Is.
var (
	// ErrBadRequest: 400 or 413, the request cannot be decided as sent
	// (a tenant or api key that is not a valid name, units out of range).
	ErrBadRequest = errors.New("bad request")
	// ErrUnauthorized: 401, the enforcer wants a bearer token (WithBearerToken)
	// it was not given or does not accept.
	ErrUnauthorized = errors.New("unauthorized")
	// ErrForbidden: 403, the plane refuses the request: an unknown tenant
	// (unknownTenants: deny) or an api key that is not the tenant's
	// (keyBinding: bound); StatusError.Level says which.
	ErrForbidden = errors.New("forbidden")
	// ErrNotFound: 404, an endpoint the plane refuses (unknownEndpoints: deny),
	// or a base URL that is not an enforcer's.
	ErrNotFound = errors.New("not found")
	// ErrUnavailable: 503, the enforcer is shutting down or could not decide
	// in time; another instance may.
	ErrUnavailable = errors.New("unavailable")
)

// StatusError is an answer other than 200 or 429: its status and the
// enforcer's message.
type StatusError struct {
	StatusCode int
	// Message is the enforcer's explanation (the "error" of its JSON body),
	// or the start of the body when it is not one.
	Message string
	// Level is the level a refusal by the plane names in X-Quota-Level
	// (tenant: an unknown tenant; key: a key that is not the tenant's), or
	// LevelNone.
	Level enforcer.Level
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("enforcer answered %d %s: %s", e.StatusCode, http.StatusText(e.StatusCode), e.Message)
}

// Is matches the Err* sentinel of e's status.
func (e *StatusError) Is(target error) bool {
	switch target {
	case ErrBadRequest:
		return e.StatusCode == http.StatusBadRequest || e.StatusCode == http.StatusRequestEntityTooLarge
	case ErrUnauthorized:
		return e.StatusCode == http.StatusUnauthorized
	case ErrForbidden:
		return e.StatusCode == http.StatusForbidden
	case ErrNotFound:
		return e.StatusCode == http.StatusNotFound
	case ErrUnavailable:
		return e.StatusCode == http.StatusServiceUnavailable
	}
	return false
}

// Client asks an enforcer's decision API (POST /api/{endpoint}) whether
// requests may pass. It is safe for concurrent use and keeps its connections
// alive between decisions: make one per enforcer address and share it.
type Client struct {
	apiURL        string // the base URL and "/api/"
	authorization string // the Authorization field, or ""
	http          *http.Client
}

type settings struct {
	token        string
	tlsConfig    *tls.Config
	timeout      time.Duration
	maxIdleConns int
	httpClient   *http.Client
}

// Option configures a Client.
type Option func(*settings)

// WithBearerToken sends "Authorization: Bearer token" with every decision,
// for enforcers started with -token-file.
func WithBearerToken(token string) Option { return func(s *settings) { s.token = token } }

// WithTLSConfig uses config for https base URLs: the enforcer's CA in
// RootCAs, and for mutual TLS this client's certificate in Certificates.
func WithTLSConfig(config *tls.Config) Option { return func(s *settings) { s.tlsConfig = config } }

// WithTimeout bounds each decision (default DefaultTimeout); the context
// given to Decide may end it sooner.
func WithTimeout(d time.Duration) Option { return func(s *settings) { s.timeout = d } }

// WithMaxIdleConns sizes the connection pool (default DefaultMaxIdleConns):
// about the number of decisions in flight at once.
func WithMaxIdleConns(n int) Option { return func(s *settings) { s.maxIdleConns = n } }

// WithHTTPClient sends decisions with c instead of the client's own pooled
// one; WithTLSConfig, WithTimeout and WithMaxIdleConns then do nothing.
func WithHTTPClient(c *http.Client) Option { return func(s *settings) { s.httpClient = c } }

// New returns a client of the enforcer at baseURL (http://host:port or
// https://host:port, optionally with a path prefix). It does not connect.
//
// Its transport dials directly, ignoring HTTP_PROXY and friends: a decision
// is on its caller's request path, and the enforcer is meant to be near.
func New(baseURL string, opts ...Option) (*Client, error) {
	u, err := url.Parse(baseURL)
	if err != nil {
		return nil, fmt.Errorf("enforcer base URL %q: %w", baseURL, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("enforcer base URL %q: want http://host:port or https://host:port", baseURL)
	}
	if u.RawQuery != "" || u.Fragment != "" {
		return nil, fmt.Errorf("enforcer base URL %q: remove the query or fragment", baseURL)
	}
	s := settings{timeout: DefaultTimeout, maxIdleConns: DefaultMaxIdleConns}
	for _, opt := range opts {
		opt(&s)
	}
	if s.token != "" && strings.ContainsAny(s.token, "\r\n") {
		return nil, errors.New("bearer token: it contains a line break; strip the token file's trailing newline")
	}
	c := &Client{apiURL: strings.TrimSuffix(u.String(), "/") + "/api/", http: s.httpClient}
	if s.token != "" {
		c.authorization = "Bearer " + s.token
	}
	if c.http == nil {
		dialer := &net.Dialer{Timeout: dialTimeout, KeepAlive: 30 * time.Second}
		c.http = &http.Client{
			Timeout: s.timeout,
			Transport: &http.Transport{
				DialContext:           dialer.DialContext,
				TLSClientConfig:       s.tlsConfig,
				TLSHandshakeTimeout:   s.timeout,
				ForceAttemptHTTP2:     s.tlsConfig != nil,
				MaxIdleConns:          s.maxIdleConns,
				MaxIdleConnsPerHost:   s.maxIdleConns,
				IdleConnTimeout:       idleConnTimeout,
				ResponseHeaderTimeout: s.timeout,
			},
			// A decision API does not redirect; following one would resend
			// the bearer token somewhere else.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		}
	}
	return c, nil
}

// CloseIdleConnections closes the pool's idle connections, for a client no
// longer used.
func (c *Client) CloseIdleConnections() { c.http.CloseIdleConnections() }

// quotaFields are the response header fields a decision carries
// (quotaheaders), in canonical form.
var quotaFields = [...]string{
	http.CanonicalHeaderKey(quotaheaders.RateLimitPolicy), http.CanonicalHeaderKey(quotaheaders.RateLimit),
	http.CanonicalHeaderKey(quotaheaders.RetryAfter), http.CanonicalHeaderKey(quotaheaders.Level),
	http.CanonicalHeaderKey(quotaheaders.Reason),
}

// decisionBody is the JSON body of a 200 or 429.
type decisionBody struct {
	Allowed       bool    `json:"allowed"`
	Tenant        string  `json:"tenant"`
	Endpoint      string  `json:"endpoint"`
	Cost          int64   `json:"cost"`
	Remaining     int64   `json:"remaining"`
	Borrowed      int64   `json:"borrowed"`
	Level         string  `json:"level"`
	Reason        string  `json:"reason"`
	RetryAfterSec float64 `json:"retryAfterSeconds"`
	Error         string  `json:"error"`
}

// Decide asks the enforcer to decide r: POST /api/{r.Endpoint} with X-Tenant,
// X-Api-Key and X-Quota-Units. A 200 or a 429 is a decision (a denial is not
// an error); any other answer is a *StatusError, a failure to reach the
// enforcer is the transport's error, both wrapped with the request's names.
//
// When header is not nil, the answer's quota header fields (RateLimit-Policy,
// RateLimit, and on a denial Retry-After, X-Quota-Level and X-Quota-Reason)
// are set in it, so a caller can pass them on: a middleware gives its
// response's header. r.Tier is not sent: the decision API takes an unknown
// tenant's tier from the plane.
func (c *Client) Decide(ctx context.Context, r enforcer.Request, header http.Header) (enforcer.Decision, error) {
	if r.Endpoint == "" {
		return enforcer.Decision{}, fmt.Errorf("deciding for tenant %q: no endpoint: %w", r.Tenant, ErrBadRequest)
	}
	// The enforcer's own validator, first, with the 400 the enforcer would
	// answer: a name the transport cannot send (a line break, a NUL) must
	// be the caller's error, never a failure to reach the enforcer that a
	// fail-open caller lets through.
	if err := enforcer.ValidateRequest(&r); err != nil {
		return enforcer.Decision{}, &StatusError{StatusCode: http.StatusBadRequest, Message: err.Error()}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.apiURL+url.PathEscape(r.Endpoint), nil)
	if err != nil {
		return enforcer.Decision{}, fmt.Errorf("deciding %s for tenant %q: %w", r.Endpoint, r.Tenant, err)
	}
	// Direct map writes: the names are canonical already and a decision is
	// on its caller's hot path.
	req.Header[quotaheaders.Tenant] = []string{r.Tenant}
	if r.APIKey != "" {
		req.Header[quotaheaders.APIKey] = []string{r.APIKey}
	}
	if r.Units > 0 {
		req.Header[quotaheaders.Units] = []string{strconv.FormatInt(r.Units, 10)}
	}
	if c.authorization != "" {
		req.Header["Authorization"] = []string{c.authorization}
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return enforcer.Decision{}, fmt.Errorf("deciding %s for tenant %q: %w", r.Endpoint, r.Tenant, err)
	}
	d, err := readAnswer(resp, header)
	if err != nil {
		return enforcer.Decision{}, fmt.Errorf("deciding %s for tenant %q: %w", r.Endpoint, r.Tenant, err)
	}
	return d, nil
}

// readAnswer reads and closes resp.
func readAnswer(resp *http.Response, header http.Header) (enforcer.Decision, error) {
	defer func() {
		// Drain what is left so the connection goes back to the pool.
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxBodyBytes))
		resp.Body.Close()
	}()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBodyBytes))
	if err != nil {
		return enforcer.Decision{}, fmt.Errorf("reading the %d answer: %w", resp.StatusCode, err)
	}
	var b decisionBody
	jsonErr := json.Unmarshal(body, &b)
	switch resp.StatusCode {
	case http.StatusOK, http.StatusTooManyRequests:
	default:
		msg := b.Error
		if jsonErr != nil || msg == "" {
			msg = strings.TrimSpace(string(body[:min(len(body), 200)]))
		}
		return enforcer.Decision{}, &StatusError{StatusCode: resp.StatusCode, Message: msg, Level: levelNamed(resp.Header.Get(quotaFields[3]))}
	}
	if jsonErr != nil {
		return enforcer.Decision{}, fmt.Errorf("the %d answer's body is not a decision: %w", resp.StatusCode, jsonErr)
	}
	if b.Allowed != (resp.StatusCode == http.StatusOK) {
		return enforcer.Decision{}, fmt.Errorf("a %d answer says allowed %t", resp.StatusCode, b.Allowed)
	}
	d := enforcer.Decision{
		Allow:     b.Allowed,
		Level:     enforcer.Level(b.Level),
		Reason:    b.Reason,
		Remaining: b.Remaining,
		Bound:     boundLevel(resp.Header.Get(quotaFields[1])),
		Cost:      b.Cost,
		Borrowed:  b.Borrowed,
	}
	if !d.Allow {
		d.RetryAfter = time.Duration(math.Round(b.RetryAfterSec * float64(time.Second)))
		if d.RetryAfter <= 0 { // an older enforcer: fall back on the header
			if s, err := strconv.ParseInt(resp.Header.Get(quotaFields[2]), 10, 64); err == nil && s > 0 {
				d.RetryAfter = time.Duration(s) * time.Second
			}
		}
	}
	if header != nil {
		for _, name := range quotaFields {
			if v := resp.Header[name]; len(v) > 0 {
				header[name] = v
			}
		}
	}
	return d, nil
}

// boundLevel reads the level RateLimit names: `"tenant";r=0;t=1`.
func boundLevel(rateLimit string) enforcer.Level {
	name, ok := strings.CutPrefix(rateLimit, `"`)
	if !ok {
		return enforcer.LevelNone
	}
	name, _, ok = strings.Cut(name, `"`)
	if !ok {
		return enforcer.LevelNone
	}
	return levelNamed(name)
}

// levelNamed is the level called name, or LevelNone.
func levelNamed(name string) enforcer.Level {
	for _, l := range enforcer.Levels {
		if string(l) == name {
			return l
		}
	}
	return enforcer.LevelNone
}
