package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotaplane/quotaplane/api/v1alpha1"
	"github.com/quotaplane/quotaplane/pkg/load"
	"github.com/quotaplane/quotaplane/pkg/policy"
	"github.com/quotaplane/quotaplane/pkg/upstream"
	"github.com/quotaplane/quotaplane/pkg/upstream/upstreamtest"
)

// outageRun is experiment 9's parts in this process: the fake upstream,
// the gateway in front of it, and (with sensing) the leader.
type outageRun struct {
	fake    *upstreamtest.Server
	gateway *load.UpstreamGateway
	log     *cycleLog
	cancel  context.CancelFunc
	wait    func()
}

// startOutage starts experiment 9's parts for the Upstream name of the
// plane in dir, the fake upstream following the timeline in file.
func startOutage(ctx context.Context, dir string, p *policy.Policy, name, file string, sense bool, rdb redis.UniversalClient, fleet *load.Fleet) (*outageRun, error) {
	if file == "" {
		return nil, errors.New("-upstream needs -upstream-timeline")
	}
	raw, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	tl, err := upstreamtest.ParseTimeline(raw)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	specs, err := readUpstream(dir, p, name)
	if err != nil {
		return nil, err
	}
	r := &outageRun{fake: upstreamtest.New(tl), log: &cycleLog{start: time.Now().UnixMilli()}, wait: func() {}}
	r.gateway = load.NewUpstreamGateway(fleet, name, r.fake.URL, specs[0].Endpoints, load.FleetReporter(fleet))
	for _, t := range p.Spec().Tenants {
		r.gateway.Watched[t.Name] = true // the plane's named tenants: experiment 9's critical ones
	}
	if sense {
		if specs[0].Probe != nil {
			specs[0].Probe.URL = r.fake.URL
		}
		lctx, cancel := context.WithCancel(ctx)
		r.cancel = cancel
		l := &upstream.Leader{Plane: p.ID(), Redis: rdb, Observe: r.log.observe,
			Load:   func(context.Context) (*policy.Policy, []policy.Upstream, error) { return p, specs, nil },
			Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))}
		var wg sync.WaitGroup
		wg.Go(func() { _ = l.Run(lctx) })
		r.wait = wg.Wait
	}
	return r, nil
}

func (r *outageRun) stop() {
	if r.cancel != nil {
		r.cancel()
	}
	r.wait()
	r.fake.Close()
}

// write stores upstream.csv (the gateway's counts), cycles.csv (the
// leader's cycles) and fake.csv (what the fake upstream answered each
// second).
func (r *outageRun) write(dir string, tiers []string) error {
	if err := r.gateway.Write(dir, tiers); err != nil {
		return err
	}
	if err := r.log.write(dir); err != nil {
		return err
	}
	secs := r.fake.Seconds()
	return load.WriteCSV(dir+"/fake.csv", []string{"t", "served", "errors", "throttled"}, len(secs), func(k int) []string {
		return []string{fmt.Sprint(k), fmt.Sprint(secs[k].Served), fmt.Sprint(secs[k].Errors), fmt.Sprint(secs[k].Throttled)}
	})
}

// readUpstream compiles the plane's Upstream named name from dir.
func readUpstream(dir string, p *policy.Policy, name string) ([]policy.Upstream, error) {
	objs, err := policy.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var ups []*v1alpha1.Upstream
	for _, o := range objs {
		if u, ok := o.(*v1alpha1.Upstream); ok && u.Name == name {
			ups = append(ups, u)
		}
	}
	specs, problems := policy.CompileUpstreams(p, ups)
	if len(problems) > 0 {
		return nil, fmt.Errorf("upstream %s: %v", name, problems)
	}
	if len(specs) != 1 {
		return nil, fmt.Errorf("-upstream %s: no such Upstream in %s", name, dir)
	}
	return specs, nil
}

// cycleLog keeps every cycle's outcome for cycles.csv.
type cycleLog struct {
	mu     sync.Mutex
	start  int64 // Unix ms
	cycles []*upstream.Cycle
}

func (c *cycleLog) observe(cy *upstream.Cycle) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cycles = append(c.cycles, cy)
}

// write stores cycles.csv in dir: per cycle, its time since the start,
// the upstream's confidence and its terms, the phase, the capacity now,
// the tenants per class and the class changes.
func (c *cycleLog) write(dir string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return load.WriteCSV(dir+"/cycles.csv",
		[]string{"t", "confidence", "error", "latency", "quota", "staleness", "phase", "capacity_now",
			"critical", "high", "medium", "low", "suspended", "changes", "err"},
		len(c.cycles), func(k int) []string {
			cy := c.cycles[k]
			row := []string{fmt.Sprintf("%.1f", float64(cy.At.UnixMilli()-c.start)/1000)}
			if len(cy.Upstreams) == 0 {
				return append(row, "", "", "", "", "", "", "", "", "", "", "", "", "", fmt.Sprint(cy.Err))
			}
			u := cy.Upstreams[0]
			now := 0.0
			if cy.Plan != nil && len(cy.Plan.Upstreams) > 0 {
				now = cy.Plan.Upstreams[0].Now(u.Terms.Confidence)
			}
			errText := ""
			if cy.Err != nil {
				errText = cy.Err.Error()
			}
			f := func(x float64) string { return fmt.Sprintf("%.4f", x) }
			return append(row, f(u.Terms.Confidence), f(u.Terms.Error), f(u.Terms.Latency), f(u.Terms.Quota), f(u.Terms.Staleness),
				u.Phase.String(), f(now),
				fmt.Sprint(u.Classes[upstream.Critical]), fmt.Sprint(u.Classes[upstream.High]), fmt.Sprint(u.Classes[upstream.Medium]),
				fmt.Sprint(u.Classes[upstream.Low]), fmt.Sprint(u.Classes[upstream.Suspended]), fmt.Sprint(len(u.Changes)), errText)
		})
}
