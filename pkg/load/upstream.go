package load

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/quotaplane/quotaplane/pkg/enforcer"
	"github.com/quotaplane/quotaplane/pkg/upstream"
)

// UpstreamGateway plays the gateway in front of an upstream for experiment
// 9 (seed 004): it wraps a Target, and for every request the target admits
// on an endpoint that draws on the upstream it calls the upstream (POST
// URL, X-Tenant set) and reports the call back to the node that decided it
// as the data path's passive report (enforcer.Engine.ReportUpstream for an
// in-process fleet, POST /quota/upstream/report for HTTP enforcers),
// batched each ReportEvery. It counts, per second of wall time since
// Start, what each class and tier was admitted on the upstream's
// endpoints, what was refused (suspended or throttled), and how the
// upstream answered.
type UpstreamGateway struct {
	Target
	Name      string
	URL       string
	Endpoints map[string]bool
	// Watched are tenants counted apart (the plane's critical ones, in
	// experiment 9), whatever their class.
	Watched map[string]bool

	client   *http.Client
	report   func(node int, calls []enforcer.UpstreamCall) error
	calls    chan struct{} // a slot per call in flight
	inFlight sync.WaitGroup
	start    time.Time
	stop     chan struct{}
	flushed  sync.WaitGroup

	mu      sync.Mutex
	pending map[int][]enforcer.UpstreamCall
	seconds []UpstreamSecond
	errs    int
	lastErr error
}

// UpstreamSecond is one second of an UpstreamGateway's counts.
type UpstreamSecond struct {
	// Admitted by the tenant's class on the upstream ("" while it was
	// healthy) and by its tier, in tokens of the upstream's endpoints.
	ByClass map[string]int64
	ByTier  map[string]int64
	// Suspended counts requests the upstream gate refused (503), Throttled
	// those it throttled (429), by class.
	Suspended int64
	Throttled map[string]int64
	// WatchedAdmitted counts the watched tenants' tokens admitted;
	// WatchedThrough their calls the upstream then answered other than
	// 429 (served or failed by it, not turned away).
	WatchedAdmitted, WatchedThrough int64
	// Served, Limited and Failed count the upstream's answers, in the
	// second they came: 2xx, 429, anything else or no answer. Dropped
	// counts admitted requests not sent: MaxInFlight calls were waiting.
	Served, Limited, Failed, Dropped int64
}

// MaxInFlight bounds the calls to the upstream waiting for an answer: the
// gateway calls it off the generator's path, so a slow upstream does not
// slow the offered load.
const MaxInFlight = 4096

// ReportEvery is how often the gateway sends its passive reports.
const ReportEvery = 200 * time.Millisecond

// NewUpstreamGateway wraps t. report sends node's passive reports.
func NewUpstreamGateway(t Target, name, url string, endpoints []string, report func(node int, calls []enforcer.UpstreamCall) error) *UpstreamGateway {
	g := &UpstreamGateway{Target: t, Name: name, URL: url, Endpoints: map[string]bool{}, Watched: map[string]bool{}, report: report,
		client: &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: MaxInFlight}},
		start:  time.Now(), stop: make(chan struct{}), pending: map[int][]enforcer.UpstreamCall{}, calls: make(chan struct{}, MaxInFlight)}
	for _, e := range endpoints {
		g.Endpoints[e] = true
	}
	g.flushed.Go(g.flushLoop)
	return g
}

// HTTPReporter sends passive reports to the enforcers at urls, as a
// gateway does: POST /quota/upstream/report.
func HTTPReporter(urls []string) func(int, []enforcer.UpstreamCall) error {
	client := &http.Client{Timeout: 5 * time.Second}
	return func(node int, calls []enforcer.UpstreamCall) error {
		var b strings.Builder
		b.WriteString(`{"calls":[`)
		for i, c := range calls {
			if i > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, `{"upstream":%q,"status":%d,"latencyMs":%.3f,"remaining":%d,"limit":%d}`, c.Upstream, c.Status, float64(c.Latency)/1e6, c.Remaining, c.Limit)
		}
		b.WriteString(`]}`)
		resp, err := client.Post(urls[node]+"/quota/upstream/report", "application/json", strings.NewReader(b.String()))
		if err != nil {
			return err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusAccepted {
			return fmt.Errorf("report: %s", resp.Status)
		}
		return nil
	}
}

// FleetReporter sends passive reports to the engines of f.
func FleetReporter(f *Fleet) func(int, []enforcer.UpstreamCall) error {
	return func(node int, calls []enforcer.UpstreamCall) error { return f.Engines[node].ReportUpstream(calls) }
}

func (g *UpstreamGateway) Decide(ctx context.Context, node int, now time.Time, r *enforcer.Request) (enforcer.Decision, error) {
	d, err := g.Target.Decide(ctx, node, now, r)
	if err != nil || !g.Endpoints[r.Endpoint] {
		return d, err
	}
	s := g.second()
	if !d.Allow {
		g.mu.Lock()
		if d.Suspended {
			g.seconds[s].Suspended++
		} else if d.Level == enforcer.LevelUpstream {
			g.seconds[s].Throttled[d.Class]++
		}
		g.mu.Unlock()
		return d, nil
	}
	cost := max(d.Cost, 1)
	g.mu.Lock()
	sec := &g.seconds[s]
	sec.ByClass[d.Class] += cost
	sec.ByTier[r.Tier] += cost
	watched := g.Watched[r.Tenant]
	if watched {
		sec.WatchedAdmitted += cost
	}
	g.mu.Unlock()
	select {
	case g.calls <- struct{}{}:
	default:
		g.mu.Lock()
		g.seconds[s].Dropped++
		g.mu.Unlock()
		return d, nil
	}
	req := *r
	g.inFlight.Go(func() {
		defer func() { <-g.calls }()
		g.record(node, g.call(context.WithoutCancel(ctx), &req), watched)
	})
	return d, nil
}

// record counts the upstream's answer to a call in the second it ended.
func (g *UpstreamGateway) record(node int, call enforcer.UpstreamCall, watched bool) {
	s := g.second()
	status := call.Status
	g.mu.Lock()
	defer g.mu.Unlock()
	sec := &g.seconds[s]
	if watched && status != 0 && status != http.StatusTooManyRequests {
		sec.WatchedThrough++
	}
	switch {
	case status/100 == 2:
		sec.Served++
	case status == http.StatusTooManyRequests:
		sec.Limited++
	default:
		sec.Failed++
	}
	g.pending[node] = append(g.pending[node], call)
}

// second is the slot of now, grown as needed.
func (g *UpstreamGateway) second() int {
	s := int(time.Since(g.start) / time.Second)
	g.mu.Lock()
	defer g.mu.Unlock()
	for len(g.seconds) <= s {
		g.seconds = append(g.seconds, UpstreamSecond{ByClass: map[string]int64{}, ByTier: map[string]int64{}, Throttled: map[string]int64{}})
	}
	return s
}

// call calls the upstream for r: its status (0 for no answer), latency
// and rate-limit reading, as a passive report.
func (g *UpstreamGateway) call(ctx context.Context, r *enforcer.Request) enforcer.UpstreamCall {
	c := enforcer.UpstreamCall{Upstream: g.Name}
	start := time.Now()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, g.URL, nil)
	if err != nil {
		return c
	}
	req.Header.Set("X-Tenant", r.Tenant)
	resp, err := g.client.Do(req)
	c.Latency = time.Since(start)
	if err != nil {
		return c
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	c.Status = resp.StatusCode
	if rd, _ := upstream.ParseRateLimit(resp.Header, upstream.RateLimitHeaders{}); rd.Known() {
		c.Remaining, c.Limit = rd.Remaining, rd.Limit
	}
	return c
}

func (g *UpstreamGateway) flushLoop() {
	t := time.NewTicker(ReportEvery)
	defer t.Stop()
	for {
		select {
		case <-g.stop:
			g.flush()
			return
		case <-t.C:
			g.flush()
		}
	}
}

func (g *UpstreamGateway) flush() {
	g.mu.Lock()
	pending := g.pending
	g.pending = map[int][]enforcer.UpstreamCall{}
	g.mu.Unlock()
	for node, calls := range pending {
		for len(calls) > 0 {
			n := min(len(calls), 1000)
			if err := g.report(node, calls[:n]); err != nil {
				g.mu.Lock()
				g.errs++
				g.lastErr = err
				g.mu.Unlock()
			}
			calls = calls[n:]
		}
	}
}

// Close waits for the calls in flight, stops the reports and closes the
// target.
func (g *UpstreamGateway) Close() error {
	g.inFlight.Wait()
	close(g.stop)
	g.flushed.Wait()
	return g.Target.Close()
}

// Write stores upstream.csv in dir: per second, the tokens admitted on the
// upstream's endpoints by class and by tier, the requests refused by the
// gate, and the upstream's answers.
func (g *UpstreamGateway) Write(dir string, tiers []string) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	classes := []string{"critical", "high", "medium", "low", ""}
	header := []string{"t"}
	for _, c := range classes {
		if c == "" {
			c = "healthy"
		}
		header = append(header, "class_"+c)
	}
	for _, t := range tiers {
		header = append(header, "tier_"+t)
	}
	header = append(header, "suspended")
	for _, c := range classes[:4] {
		header = append(header, "throttled_"+c)
	}
	header = append(header, "upstream_served", "upstream_429", "upstream_failed", "dropped", "watched_admitted", "watched_through")
	i := func(x int64) string { return strconv.FormatInt(x, 10) }
	err := WriteCSV(filepath.Join(dir, "upstream.csv"), header, len(g.seconds), func(k int) []string {
		s := g.seconds[k]
		row := []string{strconv.Itoa(k)}
		for _, c := range classes {
			row = append(row, i(s.ByClass[c]))
		}
		for _, t := range tiers {
			row = append(row, i(s.ByTier[t]))
		}
		row = append(row, i(s.Suspended))
		for _, c := range classes[:4] {
			row = append(row, i(s.Throttled[c]))
		}
		return append(row, i(s.Served), i(s.Limited), i(s.Failed), i(s.Dropped), i(s.WatchedAdmitted), i(s.WatchedThrough))
	})
	if err == nil && g.errs > 0 {
		err = fmt.Errorf("%d passive reports were refused, the last: %w", g.errs, g.lastErr)
	}
	return err
}
