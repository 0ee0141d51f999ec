package upstream

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotaplane/quotaplane/pkg/policy"
)

// Leader runs the pipeline for one plane: it probes the plane's upstreams,
// folds in the passive reports the enforcers forward, and every cycle
// computes each upstream's confidence, phase and every tenant's class,
// publishes the plan, and tells Observe. One leader runs per plane (the
// manager's leader election); a leader that takes over restores the phases
// and classes of the plan in Redis, so hysteresis survives the handover.
type Leader struct {
	// Plane is the plane's id, namespace/name.
	Plane string
	Redis redis.UniversalClient
	// Load returns the plane's policy in force and its compiled upstreams
	// (policy.CompileUpstreams).
	Load func(ctx context.Context) (*policy.Policy, []policy.Upstream, error)
	// Secret reads a probe header's value from a Secret; nil refuses such
	// headers.
	Secret func(ctx context.Context, ref policy.SecretKeyRef) (string, error)
	// Observe is told each cycle's outcome; nil ignores it.
	Observe func(*Cycle)
	// Clock is time.Now when nil; Logger slog.Default.
	Clock  func() time.Time
	Logger *slog.Logger
	// Tick is how often Run looks for due probes and cycles; 1 s when 0.
	Tick time.Duration
	// Cycle is the time to the next cycle after one whose lowest
	// confidence was c; CycleInterval when nil (tests shorten it).
	Cycle func(c float64) time.Duration

	mu       sync.Mutex // guards ups' windows' feeders and probe bookkeeping
	ups      map[string]*sensed
	next     time.Time // the next cycle
	restored bool
	probing  sync.WaitGroup
}

// sensed is one upstream's state in the leader.
type sensed struct {
	spec    policy.Upstream
	window  *Window
	phases  Phases
	classes Classifier
	prober  *Prober
	// probes: when the next is due, the last one's time and failure.
	nextProbe, lastProbe time.Time
	lastFailure          string
	headerProblem        string
	inFlight             bool
	// prior is the confidence of the plan a leader took over, published at
	// priorAt: what the upstream is believed to be until the window has a
	// sample of its own (an empty window would say healthy, and a leader
	// restarted mid-outage would lift every class at once).
	prior    float64
	priorAt  time.Time
	hasPrior bool
}

// BandMargin is how far past a band's lower edge the confidence must be
// for a tenant to be upgraded into it: a confidence that hovers at an edge,
// as a flapping upstream's does, keeps its tenants' classes. An upgrade is
// still immediate, as seed 004 asks, once the confidence is past the
// margin; a downgrade still needs two cycles (Classifier).
const BandMargin = 0.05

// classify is tenant's class this cycle: Band's at confidence c, an
// upgrade only when it holds at c − BandMargin too.
func classify(classes *Classifier, tenant string, score, c, base float64) (class Class, changed bool) {
	target := Band(score, c, base)
	if cur, ok := classes.Class(tenant); ok && target > cur {
		target = max(cur, Band(score, c-BandMargin, base))
	}
	return classes.Step(tenant, target)
}

// Cycle is one cycle's outcome.
type Cycle struct {
	At       time.Time
	Duration time.Duration
	// Interval is the time to the next cycle: CycleInterval of the lowest
	// confidence.
	Interval  time.Duration
	Plan      *Plan
	Upstreams []UpstreamCycle
	// Err is why the cycle did not publish (nil when it did).
	Err error
}

// UpstreamCycle is one upstream's part of a cycle.
type UpstreamCycle struct {
	Spec  policy.Upstream
	Terms Terms
	Phase Phase
	// Since is when the phase last changed; PhaseChanged says it did in
	// this cycle.
	Since        time.Time
	PhaseChanged bool
	// LastProbe and LastProbeError: the last probe's time and failure
	// ("" when it succeeded); HeaderProblem why its rate-limit headers
	// made no reading.
	LastProbe                     time.Time
	LastProbeError, HeaderProblem string
	// Classes counts the named tenants per class; Changes are the tenants
	// whose class changed in this cycle.
	Classes [NumClasses]int
	Changes []ClassChange
}

// ClassChange is one tenant's change of class on one upstream.
type ClassChange struct {
	Tenant   string
	From, To Class
	Score    float64
}

// LoadRetry is how soon a cycle that could not load the plane (its policy
// not yet published, Redis away) is tried again.
const LoadRetry = 5 * time.Second

// tierKey is a tier's entry in a Classifier: tenant names have no spaces.
func tierKey(tier string) string { return "tier " + tier }

// Run probes and cycles until ctx ends.
func (l *Leader) Run(ctx context.Context) error {
	tick := l.Tick
	if tick <= 0 {
		tick = time.Second
	}
	t := time.NewTicker(tick)
	defer t.Stop()
	defer l.probing.Wait()
	for {
		now := l.now()
		if !now.Before(l.next) {
			c := l.RunCycle(ctx)
			l.next = c.At.Add(c.Interval)
		}
		l.probeDue(ctx, now)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

func (l *Leader) now() time.Time {
	if l.Clock != nil {
		return l.Clock()
	}
	return time.Now()
}

func (l *Leader) logger() *slog.Logger {
	if l.Logger != nil {
		return l.Logger
	}
	return slog.Default()
}

// probeDue starts the probes that are due, each in its own goroutine, so a
// hanging target delays nothing but its own next probe.
func (l *Leader) probeDue(ctx context.Context, now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, s := range l.ups {
		if s.prober == nil || s.inFlight || now.Before(s.nextProbe) {
			continue
		}
		s.inFlight = true
		s.nextProbe = now.Add(s.spec.Probe.Interval)
		prober := s.prober
		l.probing.Go(func() {
			res := prober.Probe(ctx)
			l.mu.Lock()
			defer l.mu.Unlock()
			s.inFlight = false
			if res.Canceled {
				return
			}
			s.window.Add(res.Sample)
			s.lastProbe, s.lastFailure, s.headerProblem = res.Sample.At, res.Failure, res.HeaderProblem
		})
	}
}

// RunCycle runs one cycle now: load the plane, fold in the passive reports
// and the usage, compute confidence, phase and classes, publish the plan.
// A plane that cannot be loaded publishes nothing: the last plan stays in
// Redis until it expires (PlanTTL), and the enforcers keep it.
func (l *Leader) RunCycle(ctx context.Context) *Cycle {
	start := l.now()
	c := &Cycle{At: start, Interval: LoadRetry}
	defer func() {
		c.Duration = l.now().Sub(start)
		if c.Err != nil {
			l.logger().Warn("upstream cycle did not publish", "plane", l.Plane, "err", c.Err)
		}
		if l.Observe != nil {
			l.Observe(c)
		}
	}()
	p, specs, err := l.Load(ctx)
	if err != nil {
		c.Err = fmt.Errorf("load the plane: %w", err)
		return c
	}
	if !l.restored {
		l.restore(ctx)
	}
	if err := l.sync(ctx, specs); err != nil {
		c.Err = err
		return c
	}
	usage := l.usage(ctx)
	plan := &Plan{Plane: l.Plane}
	lowest := 1.0
	for _, spec := range specs {
		s := l.ups[spec.Name]
		if spec.Passive {
			l.drain(ctx, s, start)
		}
		uc, up := l.cycleUpstream(p, s, usage, start)
		lowest = min(lowest, up.Confidence)
		c.Upstreams = append(c.Upstreams, uc)
		plan.Upstreams = append(plan.Upstreams, up)
	}
	c.Interval = CycleInterval(lowest)
	if l.Cycle != nil {
		c.Interval = l.Cycle(lowest)
	}
	plan.Interval = c.Interval
	c.Plan = plan
	if len(plan.Upstreams) == 0 {
		// None left (deleted, or every one invalid): no plan, no gate.
		if err := l.Redis.Del(ctx, PlanKey(l.Plane)).Err(); err != nil {
			c.Err = err
		}
		return c
	}
	if err := PublishPlan(ctx, l.Redis, plan); err != nil {
		c.Err = err
	}
	return c
}

// cycleUpstream computes one upstream's confidence, phase and classes.
func (l *Leader) cycleUpstream(p *policy.Policy, s *sensed, usage map[string]float64, now time.Time) (UpstreamCycle, UpstreamPlan) {
	spec := &s.spec
	params := ConfidenceParams{LatencyCeiling: spec.LatencyCeiling, NominalLimit: float64(spec.Capacity.Rate), Fresh: fresh(spec)}
	if spec.QuotaSignal == policy.QuotaSignalLimit {
		params.QuotaSignal = QuotaSignalLimit
	}
	l.mu.Lock()
	st := s.window.Stats(now)
	terms := Explain(st, now, params)
	if st.Empty() && s.hasPrior {
		// Seed 004's ledger: the last reading, less its staleness penalty.
		stale := Staleness(now.Sub(s.priorAt))
		terms = Terms{Staleness: stale, Confidence: max(0, s.prior-stale)}
	} else if !st.Empty() {
		s.hasPrior = false
	}
	uc := UpstreamCycle{Spec: *spec, LastProbe: s.lastProbe, LastProbeError: s.lastFailure, HeaderProblem: s.headerProblem}
	l.mu.Unlock()
	if !spec.Sensing {
		terms = Terms{Confidence: 1} // static tiers: never leaves Healthy
	}
	uc.Terms = terms
	conf := terms.Confidence
	uc.Phase, uc.PhaseChanged = s.phases.Step(now, conf)
	uc.Since = s.phases.Since()

	capacity := spec.Capacity.PerSecond()
	up := UpstreamPlan{Name: spec.Name, Endpoints: spec.Endpoints, Capacity: capacity, Confidence: conf, Phase: uc.Phase,
		Tenants: map[string]TenantClass{}, Tiers: map[string]Class{}}
	if st.Limit > 0 && spec.Sensing && params.QuotaSignal == QuotaSignalLimit {
		up.Ceiling = float64(st.Limit) / spec.Capacity.Period.Seconds()
	}
	for _, tier := range p.Spec().Tiers {
		base := p.PriorityBase(tier.Name)
		up.Tiers[tier.Name], _ = classify(&s.classes, tierKey(tier.Name), base, conf, base)
	}
	for _, t := range p.Spec().Tenants {
		base := p.PriorityBase(t.Tier)
		sig := Signals{Usage: usageRatio(usage[t.Name], t.Limit)}
		if pr := t.Priority; pr != nil {
			sig.ContractValue, sig.Realtime, sig.Importance = float64(pr.ContractValue), pr.Realtime, float64(pr.Importance)/100
		}
		score := Score(base, sig)
		old, known := s.classes.Class(t.Name)
		class, changed := classify(&s.classes, t.Name, score, conf, base)
		if changed && known {
			uc.Changes = append(uc.Changes, ClassChange{Tenant: t.Name, From: old, To: class, Score: score})
		}
		uc.Classes[class]++
		if class != up.Tiers[t.Tier] {
			// Only the tenants whose class is not their tier's: the plan
			// stays small however many tenants the plane names.
			up.Tenants[t.Name] = TenantClass{Class: class, Score: score}
		}
		if class == Critical {
			up.Reserve += nominal(t.Limit, capacity)
		}
	}
	s.classes.EndCycle()
	up.Reserve = min(up.Reserve, capacity)
	return uc, up
}

// nominal is a tenant's nominal allocation on an upstream: its limit's
// rate per second, or the whole capacity for a tenant without one.
func nominal(l *policy.Limit, capacity float64) float64 {
	if l == nil || l.Rate == 0 {
		return capacity
	}
	return float64(l.Rate) / l.Period.Seconds()
}

// usageRatio is a tenant's usage over its allocation, seed 004's
// current_usage_ratio: its admitted rate over its limit's rate, at most 1.
func usageRatio(rate float64, l *policy.Limit) float64 {
	if l == nil || l.Rate == 0 || rate <= 0 {
		return 0
	}
	return min(rate/(float64(l.Rate)/l.Period.Seconds()), 1)
}

// restore takes the phases, classes and confidence of the plan in Redis,
// once: a new leader goes on where the last one left off, believing the
// last confidence (less its staleness) until it has readings of its own.
func (l *Leader) restore(ctx context.Context) {
	plan, err := ReadPlan(ctx, l.Redis, l.Plane)
	if err != nil {
		l.logger().Warn("upstream plan not restored; phases and classes start afresh", "plane", l.Plane, "err", err)
		return
	}
	l.restored = true
	if plan == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ups == nil {
		l.ups = map[string]*sensed{}
	}
	for _, up := range plan.Upstreams {
		at := time.UnixMilli(plan.PublishedMs)
		s := l.ups[up.Name]
		if s == nil { // keep what was sensed before the restore (a Load that failed at first)
			s = &sensed{window: NewWindow(DefaultWindowSpan, DefaultWindowCap)}
			l.ups[up.Name] = s
		}
		s.prior, s.priorAt, s.hasPrior = up.Confidence, at, true
		s.phases.Restore(up.Phase, at)
		for name, tc := range up.Tenants {
			s.classes.Restore(name, tc.Class)
		}
		for name, c := range up.Tiers {
			s.classes.Restore(tierKey(name), c)
		}
	}
	l.logger().Info("upstream plan restored", "plane", l.Plane, "seq", plan.Seq, "upstreams", len(plan.Upstreams))
}

// sync makes l.ups the upstreams of specs: new ones start Healthy, removed
// ones are forgotten, changed ones keep their state under the new spec.
func (l *Leader) sync(ctx context.Context, specs []policy.Upstream) error {
	// Probers first, without the lock: a Secret header is a call to the
	// API server, and probes finishing meanwhile take the lock. Secret
	// headers are read again each cycle: a rotated key is picked up
	// within one.
	type built struct {
		prober *Prober
		err    error
	}
	probers := make([]*built, len(specs))
	l.mu.Lock()
	for i, spec := range specs {
		s := l.ups[spec.Name]
		if s == nil || !probeEqual(s.spec.Probe, spec.Probe) || s.prober == nil && spec.Probe != nil || hasSecret(spec.Probe) {
			probers[i] = &built{}
		}
	}
	l.mu.Unlock()
	for i, b := range probers {
		if b != nil {
			b.prober, b.err = l.prober(ctx, specs[i].Probe)
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ups == nil {
		l.ups = map[string]*sensed{}
	}
	keep := map[string]bool{}
	for i, spec := range specs {
		keep[spec.Name] = true
		s := l.ups[spec.Name]
		if s == nil {
			s = &sensed{}
			l.ups[spec.Name] = s
		}
		if s.window == nil || s.window.Span() != spec.Window {
			s.window = NewWindow(spec.Window, DefaultWindowCap)
		}
		if b := probers[i]; b != nil {
			if b.err != nil {
				s.lastFailure = b.err.Error()
			}
			if !probeEqual(s.spec.Probe, spec.Probe) {
				s.nextProbe = time.Time{}
			}
			s.prober = b.prober
		}
		s.spec = spec
	}
	for name := range l.ups {
		if !keep[name] {
			delete(l.ups, name)
		}
	}
	return nil
}

func probeEqual(a, b *policy.Probe) bool {
	if a == nil || b == nil {
		return a == b
	}
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return string(x) == string(y)
}

// prober builds the prober of a probe spec, its secret headers read; nil
// for no probe or one whose secret cannot be read (then the upstream is
// sensed by its passive reports alone, and the error says why).
func (l *Leader) prober(ctx context.Context, ps *policy.Probe) (*Prober, error) {
	if ps == nil {
		return nil, nil
	}
	h := http.Header{}
	for _, hd := range ps.Headers {
		v := hd.Value
		if ref := hd.SecretRef; ref != nil {
			if l.Secret == nil {
				return nil, fmt.Errorf("probe header %s: no Secret reader", hd.Name)
			}
			var err error
			if v, err = l.Secret(ctx, *ref); err != nil {
				return nil, fmt.Errorf("probe header %s: %w", hd.Name, err)
			}
		}
		h.Set(hd.Name, v)
	}
	var body []byte
	if ps.Body != "" {
		body = []byte(ps.Body)
	}
	return &Prober{Method: ps.Method, URL: ps.URL, Header: h, Body: body, Timeout: ps.Timeout, Expected: ps.ExpectedStatuses,
		RateLimit: RateLimitHeaders{Remaining: ps.RemainingHeader, Limit: ps.LimitHeader, IETF: ps.IETF}, Clock: l.Clock}, nil
}

// drain folds the passive reports the enforcers forwarded since the last
// cycle into s's window as one batch: every call and error, a sample of
// CycleLatencies latencies that keeps the batch's distribution (evenly
// spaced ranks of the sorted latencies), and the lowest rate-limit reading
// of the cycle by the upstream's quota signal (lowerReading). A window holds
// a bounded number of records (one per latency): the enforcers' reports,
// hundreds a second, would otherwise push out all but the last seconds, and
// the window would not be the span it says. Reports are dropped once read;
// an unreadable one is logged.
func (l *Leader) drain(ctx context.Context, s *sensed, now time.Time) {
	raw, err := l.Redis.LPopCount(ctx, ReportsKey(l.Plane, s.spec.Name), MaxReports).Result()
	if err != nil && err != redis.Nil {
		l.logger().Warn("upstream reports not read", "plane", l.Plane, "upstream", s.spec.Name, "err", err)
		return
	}
	var n, errs int
	var latencies []time.Duration
	low := NoReading
	byLimit := s.spec.QuotaSignal == policy.QuotaSignalLimit
	for _, r := range raw {
		var rep Report
		if err := json.Unmarshal([]byte(r), &rep); err != nil {
			l.logger().Warn("upstream report unreadable", "plane", l.Plane, "upstream", s.spec.Name, "err", err)
			continue
		}
		if rep.N < 0 || rep.Errors < 0 || rep.Errors > rep.N {
			continue
		}
		n, errs = n+rep.N, errs+rep.Errors
		for _, ms := range rep.LatenciesMs {
			if ms >= 0 && ms < float64(time.Hour/time.Millisecond) {
				latencies = append(latencies, time.Duration(ms*float64(time.Millisecond)))
			}
		}
		if ValidReading(rep.Remaining, rep.Limit) && (!low.Known() || lowerReading(rep.Remaining, rep.Limit, low, byLimit)) {
			low = Reading{Remaining: rep.Remaining, Limit: rep.Limit}
		}
	}
	if n == 0 && !low.Known() {
		return
	}
	slices.Sort(latencies)
	if len(latencies) > CycleLatencies {
		sample := make([]time.Duration, CycleLatencies)
		for i := range sample {
			sample[i] = latencies[i*len(latencies)/CycleLatencies]
		}
		latencies = sample
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	s.window.AddBatch(now, n, errs, latencies)
	s.window.AddReading(now, low.Remaining, low.Limit)
}

// CycleLatencies bounds the latencies one cycle's passive reports add to
// a window: with cycles of 10 s, a 5 minute window holds 30 × 128, within
// DefaultWindowCap.
const CycleLatencies = 128

// lowerReading says whether remaining of limit is lower than r by the
// quota signal: a smaller share left (Remaining), at the same share a lower
// limit; or, byLimit (quotaSignal Limit), a lower limit, at the same limit
// a smaller share left. By share alone, a cycle that straddles a cut limit
// would keep a report from before the cut, its window nearly spent, and
// read the old limit as the cycle's (experiment 9's first degraded cycle
// did: a ceiling of 2,000/s while the provider granted 800).
func lowerReading(remaining, limit int64, r Reading, byLimit bool) bool {
	a, b := float64(remaining)/float64(limit), float64(r.Remaining)/float64(r.Limit)
	if byLimit {
		return limit < r.Limit || limit == r.Limit && a < b
	}
	return a < b || a == b && limit < r.Limit
}

// usage sums the live enforcers' usage reports: each named tenant's
// admitted rate, tokens/s.
func (l *Leader) usage(ctx context.Context) map[string]float64 {
	nodes, err := l.Redis.HKeys(ctx, NodesKey(l.Plane)).Result()
	if err != nil || len(nodes) == 0 {
		if err != nil {
			l.logger().Warn("upstream usage not read; usage ratios count as 0", "plane", l.Plane, "err", err)
		}
		return nil
	}
	keys := make([]string, len(nodes))
	for i, n := range nodes {
		keys[i] = UsageKey(l.Plane, n)
	}
	raw, err := l.Redis.MGet(ctx, keys...).Result()
	if err != nil {
		l.logger().Warn("upstream usage not read; usage ratios count as 0", "plane", l.Plane, "err", err)
		return nil
	}
	sum := map[string]float64{}
	for _, r := range raw {
		s, ok := r.(string)
		var u Usage
		if !ok || json.Unmarshal([]byte(s), &u) != nil {
			continue // expired (a node gone) or unreadable
		}
		for tenant, rate := range u.Rates {
			if rate > 0 {
				sum[tenant] += rate
			}
		}
	}
	return sum
}

// hasSecret says whether a probe sends a header read from a Secret.
func hasSecret(p *policy.Probe) bool {
	if p == nil {
		return false
	}
	for _, h := range p.Headers {
		if h.SecretRef != nil {
			return true
		}
	}
	return false
}

// fresh is how old an upstream's newest reading may be before it counts as
// stale: one probe interval, and at least one normal cycle (the passive
// reports come in each cycle).
func fresh(spec *policy.Upstream) time.Duration {
	f := NormalCycle
	if spec.Probe != nil {
		f = max(f, spec.Probe.Interval)
	}
	return f
}
