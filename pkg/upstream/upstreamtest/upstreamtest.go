// Package upstreamtest is a fake upstream for seed 004's pipeline: an HTTP
// server whose error rate, latency, capacity and rate-limit headers follow
// a scripted timeline, so that probes, passive reports and whole outage
// experiments run against something real and exactly repeatable.
//
// The timeline is a list of steps, each in force from its At (time since
// the server started) until the next one. In a step:
//
//   - Capacity is the requests per second the upstream serves; past it, in
//     the same second, it answers 429 at once. Seconds are counted from the
//     start; a fractional capacity is spread over the seconds exactly
//     (capacity 2.5: 2, 3, 2, 3, …). 0 is no limit.
//   - ErrorRate is the share of the requests it serves that fail (status
//     ErrorStatus, 503 by default). The choice is deterministic: with rate
//     r (to the millionth) the n-th request of the step fails when ⌊n·r⌋
//     grows (r = 0.25: the 4th, 8th, …), so counts are exact.
//   - Latency delays every answer but a 429.
//   - With a capacity, every answer carries OpenAI's rate-limit headers,
//     x-ratelimit-limit-requests (capacity × the limit window, 60 s by
//     default) and x-ratelimit-remaining-requests (the limit less the
//     requests served or failed in the current window, counted in fixed
//     windows from the start), and x-ratelimit-reset-requests.
//
// The clock is injectable (Options.Clock, real by default; Clock is a
// manual one), and so is the wait for the latency (Options.Sleep). The
// handler counts what it answered per second since the start (Seconds).
// A timeline is JSON (ParseTimeline: durations as Go strings, "30s"), so a
// binary can serve one.
package upstreamtest

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"time"
)

// Step is the upstream's behaviour from At (since the start) until the
// next step.
type Step struct {
	At time.Duration
	// ErrorRate is the share of served requests that fail, 0 to 1.
	ErrorRate float64
	// Latency delays every answer but a 429.
	Latency time.Duration
	// Capacity is the requests per second served before 429; 0 is no
	// limit and no rate-limit headers.
	Capacity float64
	// ErrorStatus is the status of a failed request, 503 when 0.
	ErrorStatus int
}

// Timeline is a fake upstream's script: steps in increasing At. Before the
// first step's At (when it is not 0) the upstream is healthy and
// unlimited.
type Timeline []Step

// Bounds of a timeline.
const (
	MaxSteps   = 10_000
	MaxLatency = 10 * time.Minute
	// MaxSeconds bounds the per-second counters (a day); later seconds
	// count in Totals only.
	MaxSeconds = 24 * 60 * 60
)

// Validate checks a timeline: At from 0 and increasing, ErrorRate in [0,
// 1], Latency in [0, MaxLatency], Capacity finite and ≥ 0, ErrorStatus 0
// or 400 to 599.
func (tl Timeline) Validate() error {
	if len(tl) > MaxSteps {
		return fmt.Errorf("timeline has %d steps, more than %d", len(tl), MaxSteps)
	}
	for i, s := range tl {
		switch {
		case s.At < 0 || i > 0 && s.At <= tl[i-1].At:
			return fmt.Errorf("step %d: at %s is not after the previous step's", i, s.At)
		case !(s.ErrorRate >= 0 && s.ErrorRate <= 1):
			return fmt.Errorf("step %d: errorRate %v is not in [0, 1]", i, s.ErrorRate)
		case s.Latency < 0 || s.Latency > MaxLatency:
			return fmt.Errorf("step %d: latency %s is not in [0, %s]", i, s.Latency, MaxLatency)
		case !(s.Capacity >= 0) || math.IsInf(s.Capacity, 0):
			return fmt.Errorf("step %d: capacity %v is not a rate ≥ 0", i, s.Capacity)
		case s.ErrorStatus != 0 && (s.ErrorStatus < 400 || s.ErrorStatus > 599):
			return fmt.Errorf("step %d: errorStatus %d is not 400 to 599", i, s.ErrorStatus)
		}
	}
	return nil
}

// stepJSON is a step as JSON: durations as Go duration strings.
type stepJSON struct {
	At          string  `json:"at"`
	ErrorRate   float64 `json:"errorRate,omitempty"`
	Latency     string  `json:"latency,omitempty"`
	Capacity    float64 `json:"capacity,omitempty"`
	ErrorStatus int     `json:"errorStatus,omitempty"`
}

// MarshalJSON writes a step with its durations as strings ("1m30s").
func (s Step) MarshalJSON() ([]byte, error) {
	j := stepJSON{At: s.At.String(), ErrorRate: s.ErrorRate, Capacity: s.Capacity, ErrorStatus: s.ErrorStatus}
	if s.Latency != 0 {
		j.Latency = s.Latency.String()
	}
	return json.Marshal(j)
}

// UnmarshalJSON reads a step: {"at": "30s", "errorRate": 0.5, "latency":
// "200ms", "capacity": 10, "errorStatus": 500}; all but at are optional.
func (s *Step) UnmarshalJSON(data []byte) error {
	var j stepJSON
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&j); err != nil {
		return err
	}
	at, err := time.ParseDuration(j.At)
	if err != nil {
		return fmt.Errorf("at: %w", err)
	}
	var latency time.Duration
	if j.Latency != "" {
		if latency, err = time.ParseDuration(j.Latency); err != nil {
			return fmt.Errorf("latency: %w", err)
		}
	}
	*s = Step{At: at, ErrorRate: j.ErrorRate, Latency: latency, Capacity: j.Capacity, ErrorStatus: j.ErrorStatus}
	return nil
}

// ParseTimeline decodes and validates a JSON timeline, a list of steps.
func ParseTimeline(data []byte) (Timeline, error) {
	var tl Timeline
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&tl); err != nil {
		return nil, fmt.Errorf("decode timeline: %w", err)
	}
	if err := tl.Validate(); err != nil {
		return nil, fmt.Errorf("timeline: %w", err)
	}
	return tl, nil
}

// The rate-limit headers the fake upstream sends (OpenAI's).
const (
	LimitHeader     = "x-ratelimit-limit-requests"
	RemainingHeader = "x-ratelimit-remaining-requests"
	ResetHeader     = "x-ratelimit-reset-requests"
)

// Options adjust a fake upstream; the zero value is real time and a 60 s
// limit window.
type Options struct {
	// Clock is the upstream's time; time.Now when nil.
	Clock func() time.Time
	// Sleep waits out a latency, returning early when ctx is done; a
	// timer when nil. A manual clock's Sleep advances it.
	Sleep func(ctx context.Context, d time.Duration)
	// LimitWindow is the window of the rate-limit headers, 60 s when 0
	// (OpenAI's requests per minute); 1 s gives per-second headers.
	LimitWindow time.Duration
}

// Second is what the upstream answered in one second: Served (2xx),
// Errors (ErrorStatus) and Throttled (429).
type Second struct {
	Served, Errors, Throttled int64
}

// Requests is the second's total.
func (s Second) Requests() int64 { return s.Served + s.Errors + s.Throttled }

// Handler is the fake upstream as an http.Handler. It is safe for
// concurrent use.
type Handler struct {
	timeline Timeline
	clock    func() time.Time
	sleep    func(ctx context.Context, d time.Duration)
	window   time.Duration
	start    time.Time

	mu        sync.Mutex // guards everything below
	stepIndex int        // the step in force, -1 before the first
	stepN     int64      // requests served or failed in it
	second    int64      // the second the admissions below count
	admitted  int64      // requests served or failed in second
	windowIdx int64      // the limit window windowAdmitted counts
	windowN   int64
	seconds   []Second
	totals    Second
}

// NewHandler returns a fake upstream that starts now (by o.Clock). It
// panics if tl is not valid (Validate), as httptest does when it cannot
// serve: a binary validates its timeline first (ParseTimeline).
func NewHandler(tl Timeline, o Options) *Handler {
	if err := tl.Validate(); err != nil {
		panic("upstreamtest: " + err.Error())
	}
	h := &Handler{
		timeline:  append(Timeline(nil), tl...),
		clock:     o.Clock,
		sleep:     o.Sleep,
		window:    o.LimitWindow,
		stepIndex: -1,
		second:    -1,
		windowIdx: -1,
	}
	if h.clock == nil {
		h.clock = time.Now
	}
	if h.sleep == nil {
		h.sleep = sleep
	}
	if h.window <= 0 {
		h.window = time.Minute
	}
	h.start = h.clock()
	return h
}

func sleep(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// Started is when the timeline's 0 was.
func (h *Handler) Started() time.Time { return h.start }

// outcome is what one request gets.
type outcome struct {
	status           int
	latency          time.Duration
	limited          bool // send rate-limit headers
	limit, remaining int64
	reset            time.Duration
}

// decide admits or throttles one request arriving at elapsed, and counts
// it.
func (h *Handler) decide(elapsed time.Duration) outcome {
	h.mu.Lock()
	defer h.mu.Unlock()
	if elapsed < 0 {
		elapsed = 0
	}
	i := h.stepIndex
	for i+1 < len(h.timeline) && h.timeline[i+1].At <= elapsed {
		i++
	}
	if i != h.stepIndex {
		h.stepIndex, h.stepN = i, 0
	}
	var step Step
	if i >= 0 {
		step = h.timeline[i]
	}

	sec := int64(elapsed / time.Second)
	if sec != h.second {
		h.second, h.admitted = sec, 0
	}
	win := int64(elapsed / h.window)
	if win != h.windowIdx {
		h.windowIdx, h.windowN = win, 0
	}

	var out outcome
	if step.Capacity > 0 && h.admitted >= allowance(step.Capacity, sec) {
		out.status = http.StatusTooManyRequests
		h.countLocked(sec, func(s *Second) { s.Throttled++ })
	} else {
		h.admitted++
		h.windowN++
		out.latency = step.Latency
		if fails(step.ErrorRate, h.stepN) {
			out.status = cmp.Or(step.ErrorStatus, http.StatusServiceUnavailable)
			h.countLocked(sec, func(s *Second) { s.Errors++ })
		} else {
			out.status = http.StatusOK
			h.countLocked(sec, func(s *Second) { s.Served++ })
		}
		h.stepN++
	}
	if step.Capacity > 0 {
		out.limited = true
		out.limit = max(int64(math.Round(step.Capacity*h.window.Seconds())), 1)
		out.remaining = max(out.limit-h.windowN, 0)
		out.reset = time.Duration(win+1)*h.window - elapsed
	}
	return out
}

// countLocked counts an answer in second sec and in the totals.
func (h *Handler) countLocked(sec int64, count func(*Second)) {
	count(&h.totals)
	if sec >= MaxSeconds {
		return
	}
	for int64(len(h.seconds)) <= sec {
		h.seconds = append(h.seconds, Second{})
	}
	count(&h.seconds[sec])
}

// allowance is how many requests second sec admits at capacity: the
// seconds' allowances add up to ⌊capacity·(sec+1)⌋.
func allowance(capacity float64, sec int64) int64 {
	return int64(math.Floor(capacity*float64(sec+1))) - int64(math.Floor(capacity*float64(sec)))
}

// fails says whether the n-th (from 0) admitted request of a step with
// error rate rate fails: when ⌊(n+1)·rate⌋ grows, the rate in millionths
// so that the choice is exact.
func fails(rate float64, n int64) bool {
	r := int64(math.Round(rate * 1e6))
	return (n+1)*r/1e6 > n*r/1e6
}

// ServeHTTP answers one request as the timeline says.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	out := h.decide(h.clock().Sub(h.start))
	if out.limited {
		w.Header().Set(LimitHeader, strconv.FormatInt(out.limit, 10))
		w.Header().Set(RemainingHeader, strconv.FormatInt(out.remaining, 10))
		w.Header().Set(ResetHeader, out.reset.Round(time.Millisecond).String())
	}
	w.Header().Set("Content-Type", "application/json")
	if out.status == http.StatusTooManyRequests {
		w.Header().Set("Retry-After", "1")
		w.WriteHeader(out.status)
		fmt.Fprintln(w, `{"error":"rate limited"}`)
		return
	}
	h.sleep(r.Context(), out.latency)
	w.WriteHeader(out.status)
	if out.status == http.StatusOK {
		fmt.Fprintln(w, `{"ok":true}`)
	} else {
		fmt.Fprintln(w, `{"error":"upstream failure"}`)
	}
}

// Seconds returns what the upstream answered in each second since the
// start, up to the last second it answered in (at most MaxSeconds).
func (h *Handler) Seconds() []Second {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]Second(nil), h.seconds...)
}

// Totals is what the upstream answered since the start.
func (h *Handler) Totals() Second {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.totals
}

// Server is a fake upstream listening on a local port (httptest).
type Server struct {
	*Handler
	// URL is the server's base URL, http://127.0.0.1:port.
	URL string
	srv *httptest.Server
}

// New starts a fake upstream following timeline in real time. It panics
// if timeline is not valid.
func New(timeline Timeline) *Server { return NewServer(timeline, Options{}) }

// NewServer starts a fake upstream with options.
func NewServer(timeline Timeline, o Options) *Server {
	h := NewHandler(timeline, o)
	srv := httptest.NewServer(h)
	return &Server{Handler: h, URL: srv.URL, srv: srv}
}

// Client is a client for the server.
func (s *Server) Client() *http.Client { return s.srv.Client() }

// Close shuts the server down, waiting for the requests in flight.
func (s *Server) Close() { s.srv.Close() }

// Clock is a manual clock for tests: it moves only when told to. It is
// safe for concurrent use.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// NewClock returns a clock reading start.
func NewClock(start time.Time) *Clock { return &Clock{now: start} }

// Now reads the clock.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock d forward (a negative d moves it back).
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// Set moves the clock to t.
func (c *Clock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = t
}

// Sleep advances the clock by d at once (Options.Sleep): a latency in
// virtual time.
func (c *Clock) Sleep(_ context.Context, d time.Duration) {
	if d > 0 {
		c.Advance(d)
	}
}
