package load

import (
	"context"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quotaplane/quotaplane/pkg/enforcer"
)

// Epoch is where virtual time starts.
var Epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// Options say how to run a profile against a target.
type Options struct {
	// Virtual runs in virtual time: one stream, decided in order at its
	// scheduled instants (DecideAt), as fast as the engine goes. Exact and
	// deterministic; for the fairness and attribution experiments. Only
	// in-process targets.
	Virtual bool
	// Workers is the number of generator goroutines in real time (default
	// GOMAXPROCS). Each offers Rate/Workers as its own seeded Poisson stream.
	Workers int
	// Warmup is left out of the per-tenant counts (not of the time series).
	Warmup time.Duration
	// Oracle, when set (virtual time only), predicts every decision
	// independently; disagreements are counted.
	Oracle Oracle
	// Progress, when set, gets a line every second of the run.
	Progress io.Writer
	// Routing is how requests reach a fleet's nodes (Routings): round
	// robin by default.
	Routing string
}

// Routings are the ways Options.Routing sends requests to a fleet's
// nodes: in turn whatever their tenant ("round-robin", a balancer's
// default); every request of a tenant to one node ("pinned", a balancer
// that hashes by tenant); or nine in ten to the tenant's node and the tenth
// to the next ("skewed").
var Routings = []string{"round-robin", "pinned", "skewed"}

// route picks the node of the n-th request of a worker for tenant, of
// nodes; next is the worker's round-robin turn.
func route(routing string, tenant int, n int64, next, nodes int) int {
	switch routing {
	case "pinned":
		return tenant % nodes
	case "skewed":
		if n%10 == 9 {
			return (tenant + 1) % nodes
		}
		return tenant % nodes
	}
	return next
}

// Oracle is an independent model of the engine's decisions.
type Oracle interface {
	Decide(now time.Time, r *enforcer.Request) (allow bool, level enforcer.Level)
}

// arrival is one scheduled request.
type arrival struct {
	at     float64 // seconds since the start
	tenant int
	key    int
	ep     int
	spike  bool
}

// stream is one seeded open-model arrival process: the profile's Poisson
// stream at rate, merged with each spike's own at its rate in its window.
type stream struct {
	b      *Built
	rng    *rand.Rand
	rate   float64
	next   float64
	spikes []spikeStream
}

type spikeStream struct {
	tenant   int
	rate     float64
	from, to float64
	next     float64
}

func newStream(b *Built, seed uint64, share float64) *stream {
	s := &stream{b: b, rng: rand.New(rand.NewPCG(b.Seed, seed)), rate: b.Rate * share}
	s.next = s.gap(s.rate)
	for _, sp := range b.Spikes {
		i, _ := b.Index(sp.Tenant)
		ss := spikeStream{tenant: i, rate: sp.Rate * share, from: sp.From.Seconds(), to: sp.To.Seconds()}
		ss.next = ss.from + s.gap(ss.rate)
		s.spikes = append(s.spikes, ss)
	}
	return s
}

func (s *stream) gap(rate float64) float64 {
	if rate <= 0 {
		return math.Inf(1)
	}
	return s.rng.ExpFloat64() / rate
}

// pop returns the next arrival.
func (s *stream) pop() arrival {
	at, src := s.next, -1
	for i := range s.spikes {
		if sp := &s.spikes[i]; sp.next < sp.to && sp.next < at {
			at, src = sp.next, i
		}
	}
	a := arrival{at: at}
	if src < 0 {
		a.tenant = s.b.tenant.draw(s.rng)
		s.next += s.gap(s.rate)
	} else {
		sp := &s.spikes[src]
		a.tenant, a.spike = sp.tenant, true
		sp.next += s.gap(sp.rate)
	}
	a.key = s.rng.IntN(s.b.KeysPerTenant)
	a.ep = s.b.endpoint(s.rng.Float64())
	return a
}

// Run offers b to t and counts what happened.
func Run(ctx context.Context, b *Built, t Target, o Options) (*Result, error) {
	seconds := int(math.Ceil(b.Duration.Seconds()))
	attacker := make([]bool, len(b.Tenants))
	for _, sp := range b.Spikes {
		i, _ := b.Index(sp.Tenant)
		attacker[i] = true
	}
	reqs := make([][]enforcer.Request, len(b.Tenants)) // by tenant, by key and endpoint
	for i := range b.Tenants {
		tn := &b.Tenants[i]
		reqs[i] = make([]enforcer.Request, b.KeysPerTenant*len(b.Endpoints))
		for k := range b.KeysPerTenant {
			for e, ep := range b.Endpoints {
				reqs[i][k*len(b.Endpoints)+e] = enforcer.Request{Tenant: tn.Name, APIKey: tn.keys[k], Endpoint: ep.Name, Tier: tn.Tier}
			}
		}
	}
	w := &worker{b: b, t: t, o: &o, attacker: attacker, reqs: reqs, warmup: o.Warmup.Seconds()}

	var progress atomic.Int64 // decisions so far
	done := make(chan struct{})
	defer close(done)
	if o.Progress != nil {
		go reportProgress(o.Progress, &progress, b.Duration, done)
	}
	// Room for a run that falls behind its schedule; a second past it is
	// counted in the last slot.
	wallSeconds := 2*seconds + 60
	start := time.Now()
	var total *counts
	if o.Virtual {
		if o.Workers > 1 {
			return nil, fmt.Errorf("load: virtual time runs one stream; drop -workers")
		}
		total = newCounts(len(b.Tenants), seconds, 0)
		if err := w.run(ctx, newStream(b, 1, 1), total, time.Time{}, 0, &progress); err != nil {
			return nil, err
		}
	} else {
		if o.Oracle != nil {
			return nil, fmt.Errorf("load: the oracle needs virtual time (decisions in a known order)")
		}
		n := o.Workers
		if n <= 0 {
			n = runtime.GOMAXPROCS(0)
		}
		parts := make([]*counts, n)
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := range n {
			parts[i] = newCounts(len(b.Tenants), seconds, wallSeconds)
			wg.Go(func() {
				errs[i] = w.run(ctx, newStream(b, uint64(i+1), 1/float64(n)), parts[i], start, i, &progress)
			})
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				return nil, err
			}
		}
		total = parts[0]
		for _, p := range parts[1:] {
			total.merge(p)
		}
	}
	return newResult(b, &o, total, time.Since(start)), nil
}

// worker runs one stream.
type worker struct {
	b        *Built
	t        Target
	o        *Options
	attacker []bool
	reqs     [][]enforcer.Request
	warmup   float64
}

// run offers the stream s in virtual time (start zero) or paced against
// the wall clock from start; id spreads the workers over the nodes.
func (w *worker) run(ctx context.Context, s *stream, c *counts, start time.Time, id int, progress *atomic.Int64) error {
	nodes := w.t.Nodes()
	node := id % nodes
	dur := w.b.Duration.Seconds()
	var n int64
	for {
		a := s.pop()
		if a.at >= dur {
			break
		}
		if n++; n&1023 == 0 {
			progress.Add(1024)
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		req := &w.reqs[a.tenant][a.key*len(w.b.Endpoints)+a.ep]
		sec := &c.seconds[int(a.at)]
		var now time.Time
		began := time.Now()
		if start.IsZero() {
			now = Epoch.Add(time.Duration(a.at * float64(time.Second)))
		} else {
			due := start.Add(time.Duration(a.at * float64(time.Second)))
			if wait := due.Sub(began); wait > 100*time.Microsecond {
				time.Sleep(wait)
				began = time.Now()
			}
			sec.Lag.Add(max(began.Sub(due), 0))
		}
		d, err := w.t.Decide(ctx, route(w.o.Routing, a.tenant, n, node, nodes), now, req)
		took := time.Since(began)
		node++
		if node == nodes {
			node = 0
		}
		var ws *WallSecond
		if len(c.wall) > 0 {
			ws = &c.wall[min(int(began.Sub(start)/time.Second), len(c.wall)-1)]
			ws.Decided++
		}
		if err != nil {
			sec.Errors++
			continue
		}
		sec.Offered++
		sec.OfferedTokens += d.Cost
		sec.Latency.Add(took)
		if ws != nil {
			ws.OfferedTokens += d.Cost
		}
		if d.Allow {
			sec.Admitted++
			sec.AdmittedTokens += d.Cost
			sec.Borrowed += d.Borrowed
			if ws != nil {
				ws.AdmittedTokens += d.Cost
			}
		}
		if w.attacker[a.tenant] {
			sec.AttackerOffered++
			if d.Allow {
				sec.AttackerAdmitted++
			}
		} else {
			sec.VictimOffered++
			sec.VictimLatency.Add(took)
			if d.Allow {
				sec.VictimAdmitted++
			} else if d.Level == enforcer.LevelGlobal {
				sec.VictimDeniedGlobal++
			}
		}
		if w.o.Oracle != nil {
			allow, level := w.o.Oracle.Decide(now, req)
			sec.OracleChecked++
			if allow != d.Allow || level != d.Level {
				sec.OracleMismatches++
			}
		}
		if a.at >= w.warmup {
			tc := &c.tenants[a.tenant]
			tc.Offered++
			tc.OfferedTokens += d.Cost
			if d.Allow {
				tc.Admitted++
				tc.AdmittedTokens += d.Cost
				tc.Borrowed += d.Borrowed
			} else if d.Level == enforcer.LevelUpstream {
				tc.DeniedUpstream++
			} else {
				tc.Denied[levelIndex(d.Level)]++
			}
		}
	}
	progress.Add(n & 1023)
	return nil
}

func reportProgress(out io.Writer, progress *atomic.Int64, total time.Duration, done <-chan struct{}) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	start, last := time.Now(), int64(0)
	for {
		select {
		case <-done:
			return
		case <-tick.C:
		}
		n := progress.Load()
		fmt.Fprintf(out, "load: %s elapsed, %d decisions, %.0f/s over the last second (run length %s)\n",
			time.Since(start).Round(time.Second), n, float64(n-last), total)
		last = n
	}
}
