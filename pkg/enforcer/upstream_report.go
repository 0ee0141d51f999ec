package enforcer

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotaplane/quotaplane/pkg/policy"
	"github.com/quotaplane/quotaplane/pkg/upstream"
)

// Passive reports: the data path (a gateway, the middleware) tells an
// enforcer how its calls to an upstream went (ReportUpstream); the enforcer
// sums them per upstream and forwards one upstream.Report per upstream each
// reconcile interval to the list the leader drains, so the leader's
// confidence sees the fleet's traffic, not only its probe.

// UpstreamCall is one call to an upstream, or several alike.
type UpstreamCall struct {
	Upstream string
	// Status is the HTTP status the upstream answered, 0 for no answer.
	Status int
	// Latency is how long the call took.
	Latency time.Duration
	// Count is how many calls this stands for (0 counts as 1).
	Count int
	// Remaining and Limit are a rate-limit reading the answer carried;
	// both 0 for none.
	Remaining, Limit int64
}

// pendingReports sums the calls reported since the last flush.
type pendingReports struct {
	mu     sync.Mutex
	byName map[string]*upstream.Report
}

// ReportUpstream records calls to upstreams for the leader. It fails, and
// records nothing, when a call names no valid upstream, has a negative
// count or latency, a status outside 0 and 100–599, an impossible
// rate-limit reading, or when the calls would name more than
// upstream.MaxUpstreams upstreams since the last flush. Without Redis there
// is no leader to tell: it fails too.
func (e *Engine) ReportUpstream(calls []UpstreamCall) error {
	if e.redis == nil {
		return fmt.Errorf("%w: this enforcer has no Redis, so no leader reads upstream reports", ErrInvalidRequest)
	}
	for i, c := range calls {
		switch {
		case !policy.ValidTierName(c.Upstream):
			return fmt.Errorf("%w: report %d: upstream %q is not an upstream name (a DNS label)", ErrInvalidRequest, i, c.Upstream)
		case c.Status != 0 && (c.Status < 100 || c.Status > 599):
			return fmt.Errorf("%w: report %d: status %d is not an HTTP status (0 for no answer)", ErrInvalidRequest, i, c.Status)
		case c.Latency < 0 || c.Latency > time.Hour:
			return fmt.Errorf("%w: report %d: latency %s out of range [0, 1h]", ErrInvalidRequest, i, c.Latency)
		case c.Count < 0 || c.Count > 1_000_000:
			return fmt.Errorf("%w: report %d: count %d out of range [0, 1000000]", ErrInvalidRequest, i, c.Count)
		case c.Remaining < 0 || c.Limit < 0 || c.Remaining > c.Limit:
			return fmt.Errorf("%w: report %d: rate-limit reading remaining %d of limit %d is not possible", ErrInvalidRequest, i, c.Remaining, c.Limit)
		}
	}
	pr := &e.gate.reports
	pr.mu.Lock()
	defer pr.mu.Unlock()
	if pr.byName == nil {
		pr.byName = map[string]*upstream.Report{}
	}
	var fresh []string // names new since the last flush
	for _, c := range calls {
		if pr.byName[c.Upstream] == nil && !slices.Contains(fresh, c.Upstream) {
			fresh = append(fresh, c.Upstream)
			if len(pr.byName)+len(fresh) > upstream.MaxUpstreams {
				break
			}
		}
	}
	if len(pr.byName)+len(fresh) > upstream.MaxUpstreams {
		return fmt.Errorf("%w: reports name more than %d upstreams", ErrInvalidRequest, upstream.MaxUpstreams)
	}
	for _, c := range calls {
		r := pr.byName[c.Upstream]
		if r == nil {
			r = &upstream.Report{Node: e.nodeID, Remaining: -1, Limit: -1}
			pr.byName[c.Upstream] = r
		}
		n := max(c.Count, 1)
		r.N += n
		if upstream.IsError(c.Status) {
			r.Errors += n
		}
		for range min(n, upstream.MaxReportLatencies-len(r.LatenciesMs)) {
			r.LatenciesMs = append(r.LatenciesMs, math.Round(c.Latency.Seconds()*1e6)/1e3)
		}
		if c.Limit > 0 {
			r.Remaining, r.Limit = c.Remaining, c.Limit
		}
	}
	return nil
}

// flushReports sends what was reported since the last flush, one pipeline:
// a report per upstream pushed on its list, trimmed to upstream.MaxReports,
// and the usage report when one is due.
// Reports Redis does not take are dropped: a reading is only worth its
// freshness.
func (e *Engine) flushReports(ctx context.Context, p *policy.Policy, now int64) error {
	pr := &e.gate.reports
	pr.mu.Lock()
	pending := pr.byName
	pr.byName = nil
	pr.mu.Unlock()
	var usage *upstream.Usage
	if e.gate.held != nil { // a plane with upstreams: its leader publishes a plan every cycle
		usage = e.usageReport(now)
	}
	if len(pending) == 0 && usage == nil {
		return nil
	}
	_, err := e.redis.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		if usage != nil {
			body, err := json.Marshal(usage)
			if err != nil {
				return err
			}
			pipe.Set(ctx, upstream.UsageKey(p.ID(), e.nodeID), body, 3*upstream.UsageInterval)
		}
		for name, r := range pending {
			r.AtMs = now / 1000
			body, err := json.Marshal(r)
			if err != nil {
				return err
			}
			key := upstream.ReportsKey(p.ID(), name)
			pipe.RPush(ctx, key, body)
			pipe.LTrim(ctx, key, -upstream.MaxReports, -1)
			pipe.PExpire(ctx, key, upstream.PlanTTL)
		}
		return nil
	})
	return err
}

// Usage: the leader's priority score counts a tenant's live usage ratio
// (seed 004: usage over allocation). Every upstream.UsageInterval each
// enforcer that holds a plan reports the rate its busiest named tenants
// were admitted at, tokens/s (upstream.Usage, under upstream.UsageKey,
// expiring); the leader sums the live nodes' and divides by each tenant's
// limit.

// usageTenants bounds a usage report.
const usageTenants = 512

// usageState is the loop's memory of the tenants' admitted totals.
type usageState struct {
	last   int64 // µs of the last report
	totals map[string]int64
}

// usageReport is the node's report now, or nil when one is not due.
func (e *Engine) usageReport(now int64) *upstream.Usage {
	u := &e.gate.usage
	if now-u.last < upstream.UsageInterval.Microseconds() {
		return nil
	}
	seconds := float64(now-u.last) / 1e6
	first := u.last == 0
	u.last = now
	snap := e.snap.Load()
	totals := make(map[string]int64, len(snap.known))
	type rate struct {
		name string
		rate float64
	}
	var rates []rate
	for name, ts := range snap.known {
		ts.mu.Lock()
		total := ts.admittedCost
		ts.mu.Unlock()
		totals[name] = total
		if prev, ok := u.totals[name]; ok && !first && total > prev {
			rates = append(rates, rate{name, float64(total-prev) / seconds})
		}
	}
	u.totals = totals
	if first {
		return nil
	}
	slices.SortFunc(rates, func(a, b rate) int { return cmp.Compare(b.rate, a.rate) })
	report := &upstream.Usage{Node: e.nodeID, AtMs: now / 1000, Rates: map[string]float64{}}
	for _, r := range rates[:min(len(rates), usageTenants)] {
		report.Rates[r.name] = math.Round(r.rate*1000) / 1000
	}
	return report
}
