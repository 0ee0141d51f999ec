package upstream

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"
)

// Probe defaults: seed 004's 5 s timeout (httpx.AsyncClient(timeout=5.0)).
const (
	DefaultProbeTimeout = 5 * time.Second
	// MaxProbeBody is how much of an answer's body a probe reads (and
	// discards) so the connection can be reused; a longer body closes it.
	MaxProbeBody = 64 << 10
)

// Prober sends one upstream's health probe, seed 004's probe_once: an HTTP
// request whose status, latency and rate-limit headers make a Sample.
// Set its fields before the first Probe and leave them; Probe may then be
// called from several goroutines.
type Prober struct {
	// Method is GET when empty.
	Method string
	URL    string
	// Header is sent with every probe (a Host entry sets the Host).
	Header http.Header
	// Body is sent with every probe; none when nil.
	Body []byte
	// Timeout bounds a probe from sending to the end of the body read;
	// DefaultProbeTimeout when ≤ 0. A probe that takes longer is an error
	// sample whose latency is Timeout.
	Timeout time.Duration
	// Expected are the statuses that count as success; nil is any 2xx.
	// Any other status is an error sample.
	Expected []int
	// RateLimit names the rate-limit headers read (ParseRateLimit).
	RateLimit RateLimitHeaders
	// Client sends the probes; nil is a client of its own that does not
	// follow redirects (a 3xx is a status the probe judges).
	Client *http.Client
	// Clock stamps samples and measures latency; time.Now when nil.
	Clock func() time.Time
}

// ProbeResult is one probe's sample and what went wrong.
type ProbeResult struct {
	Sample Sample
	// Failure says why Sample.Err is set ("" when it is not): the
	// transport's error, "timed out after …" or "status … not expected".
	Failure string
	// HeaderProblem is why rate-limit headers present on the answer made
	// no reading (ParseRateLimit); "" when they did or were absent.
	HeaderProblem string
	// Canceled says the probe was cut short by ctx, not by its timeout:
	// the sample says nothing about the upstream and should be dropped.
	Canceled bool
}

var defaultProbeClient = &http.Client{
	CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
}

// Probe sends one probe and returns its result. It returns within Timeout
// (and at once when ctx is done).
func (p *Prober) Probe(ctx context.Context) ProbeResult {
	now := p.Clock
	if now == nil {
		now = time.Now
	}
	client := p.Client
	if client == nil {
		client = defaultProbeClient
	}
	timeout := p.Timeout
	if timeout <= 0 {
		timeout = DefaultProbeTimeout
	}
	res := ProbeResult{Sample: Sample{Remaining: -1, Limit: -1}}

	start := now()
	pctx, cancel := context.WithTimeoutCause(ctx, timeout, errProbeTimeout)
	defer cancel()
	status, header, err := p.send(pctx, client)
	end := now()

	res.Sample.At = end
	res.Sample.Latency = max(end.Sub(start), 0)
	res.Sample.Status = status
	if header != nil {
		var reading Reading
		reading, res.HeaderProblem = ParseRateLimit(header, p.RateLimit)
		res.Sample.Remaining, res.Sample.Limit = reading.Remaining, reading.Limit
	}
	switch {
	case err != nil && ctx.Err() != nil:
		res.Sample.Err, res.Canceled = true, true
		res.Failure = fmt.Sprintf("canceled: %v", context.Cause(ctx))
	case err != nil && errors.Is(context.Cause(pctx), errProbeTimeout):
		res.Sample.Err = true
		res.Sample.Latency = timeout
		res.Failure = fmt.Sprintf("timed out after %s", timeout)
	case err != nil:
		res.Sample.Err = true
		res.Failure = err.Error()
	case !p.expects(status):
		res.Sample.Err = true
		res.Failure = fmt.Sprintf("status %d not expected", status)
	}
	return res
}

var errProbeTimeout = errors.New("probe timeout")

// send makes the request and reads at most MaxProbeBody of the answer; the
// header is the answer's even when reading its body fails.
func (p *Prober) send(ctx context.Context, client *http.Client) (int, http.Header, error) {
	var body io.Reader
	if p.Body != nil {
		body = bytes.NewReader(p.Body)
	}
	req, err := http.NewRequestWithContext(ctx, cmp.Or(p.Method, http.MethodGet), p.URL, body)
	if err != nil {
		return 0, nil, fmt.Errorf("probe %s: %w", p.URL, err)
	}
	for name, values := range p.Header {
		if strings.EqualFold(name, "Host") && len(values) > 0 {
			req.Host = values[0]
			continue
		}
		for _, v := range values {
			req.Header.Add(name, v)
		}
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	if _, err := io.CopyN(io.Discard, resp.Body, MaxProbeBody); err != nil && err != io.EOF {
		return resp.StatusCode, resp.Header, fmt.Errorf("read the answer: %w", err)
	}
	return resp.StatusCode, resp.Header, nil
}

func (p *Prober) expects(status int) bool {
	if p.Expected == nil {
		return status >= 200 && status <= 299
	}
	return slices.Contains(p.Expected, status)
}
