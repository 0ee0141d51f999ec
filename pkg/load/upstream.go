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

	client  *http.Client
	report  func(node int, calls []enforcer.UpstreamCall) error
	start   time.Time
	stop    chan struct{}
	flushed sync.WaitGroup

	mu      sync.Mutex
	pending map[int][]enforcer.UpstreamCall
	seconds []UpstreamSecond
	errs    int
}

// UpstreamSecond is one second of an UpstreamGateway's counts.
type UpstreamSecond struct {
	// Admitted by the tenant's class on the upstream ("" while it was
	// healthy) and by its tier, in tokens of the upstream's endpoints.
	ByClass map[string]int64
	ByTier  map[string]int64
	// Suspended and Throttled count requests the upstream gate refused.
	Suspended, Throttled int64
	// Served, Limited and Failed count the upstream's answers: 2xx, 429,
	// anything else or no answer.
	Served, Limited, Failed int64
}

// ReportEvery is how often the gateway sends its passive reports.
const ReportEvery = 200 * time.Millisecond

// NewUpstreamGateway wraps t. report sends node's passive reports.
func NewUpstreamGateway(t Target, name, url string, endpoints []string, report func(node int, calls []enforcer.UpstreamCall) error) *UpstreamGateway {
	g := &UpstreamGateway{Target: t, Name: name, URL: url, Endpoints: map[string]bool{}, report: report,
		client: &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 256}},
		start:  time.Now(), stop: make(chan struct{}), pending: map[int][]enforcer.UpstreamCall{}}
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
			fmt.Fprintf(&b, `{"upstream":%q,"status":%d,"latencyMs":%.3f}`, c.Upstream, c.Status, float64(c.Latency)/1e6)
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
			g.seconds[s].Throttled++
		}
		g.mu.Unlock()
		return d, nil
	}
	cost := max(d.Cost, 1)
	status, latency := g.call(ctx, r)
	g.mu.Lock()
	defer g.mu.Unlock()
	sec := &g.seconds[s]
	sec.ByClass[d.Class] += cost
	sec.ByTier[r.Tier] += cost
	switch {
	case status/100 == 2:
		sec.Served++
	case status == http.StatusTooManyRequests:
		sec.Limited++
	default:
		sec.Failed++
	}
	g.pending[node] = append(g.pending[node], enforcer.UpstreamCall{Upstream: g.Name, Status: status, Latency: latency})
	return d, nil
}

// second is the slot of now, grown as needed.
func (g *UpstreamGateway) second() int {
	s := int(time.Since(g.start) / time.Second)
	g.mu.Lock()
	defer g.mu.Unlock()
	for len(g.seconds) <= s {
		g.seconds = append(g.seconds, UpstreamSecond{ByClass: map[string]int64{}, ByTier: map[string]int64{}})
	}
	return s
}

// call calls the upstream for r: its status (0 for no answer) and latency.
func (g *UpstreamGateway) call(ctx context.Context, r *enforcer.Request) (int, time.Duration) {
	start := time.Now()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, g.URL, nil)
	if err != nil {
		return 0, 0
	}
	req.Header.Set("X-Tenant", r.Tenant)
	resp, err := g.client.Do(req)
	if err != nil {
		return 0, time.Since(start)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, time.Since(start)
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
				g.mu.Unlock()
			}
			calls = calls[n:]
		}
	}
}

// Close stops the reports and closes the target.
func (g *UpstreamGateway) Close() error {
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
	header = append(header, "suspended", "throttled", "upstream_served", "upstream_429", "upstream_failed")
	i := func(x int64) string { return strconv.FormatInt(x, 10) }
	err := writeCSV(filepath.Join(dir, "upstream.csv"), header, len(g.seconds), func(k int) []string {
		s := g.seconds[k]
		row := []string{strconv.Itoa(k)}
		for _, c := range classes {
			row = append(row, i(s.ByClass[c]))
		}
		for _, t := range tiers {
			row = append(row, i(s.ByTier[t]))
		}
		return append(row, i(s.Suspended), i(s.Throttled), i(s.Served), i(s.Limited), i(s.Failed))
	})
	if err == nil && g.errs > 0 {
		err = fmt.Errorf("%d passive reports were refused", g.errs)
	}
	return err
}
