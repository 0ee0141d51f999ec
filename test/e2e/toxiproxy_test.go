package e2e

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/rs/zerolog"

	"github.com/quotaplane/quotaplane/pkg/poll"
	"github.com/quotaplane/quotaplane/pkg/redistest"
	"github.com/quotaplane/quotaplane/pkg/testenv"
)

// TestToxiproxy injects faults on the Redis link for real: each of two
// enforcer processes (cmd/enforcer, the sample plane) reaches one
// redis-server through its own Toxiproxy proxy, so that one node can be
// cut off while the other keeps Redis. Toxiproxy's server runs in this
// test's process (github.com/Shopify/toxiproxy/v2, its proxy and toxics
// without the HTTP API): nothing to build or cache.
//
// In each mode (central, local-reconciled) the fleet runs one cell per
// fault under bounded HTTP load: fresh free-tier tenants (50 tokens/s,
// burst 100 each; 4 in make test, 8 in the whole matrix), each offered
// twice its limit, round-robin over the nodes. A cell runs the load for
// a second, injects the fault for its duration, heals it and runs the
// load until the end. Per cell it measures and checks:
//
//   - every decision answered, none slower than the enforcer's Redis
//     deadline (50 ms) plus a margin for a loaded 2-core machine
//     (toxiMargin), and no 5xx;
//   - the tokens admitted against rate × time + burst, summed over the
//     tenants: the overage, which must stay within the bound the fault's
//     class allows (toxiBound);
//   - how long after the heal every node is out of degraded operation
//     (quotaplane_enforcer_backend_degraded 0) and deciding through Redis
//     again (its script calls succeed, no failure-mode decisions);
//   - the lines per second the nodes log during the fault.
//
// make test runs a subset (50 ms latency, a partition of one node, a
// half-open link, in both modes) in about a minute; hack/chaos/toxiproxy.sh
// runs the whole matrix (QUOTAPLANE_TOXI_MATRIX=full: every latency,
// jitter, resets, longer faults) and prints the table
// (QUOTAPLANE_TOXI_TABLE names the file the rows go to).
func TestToxiproxy(t *testing.T) {
	if os.Getenv("QUOTAPLANE_E2E_CLUSTER") != "" {
		t.Skip("runs its own enforcers and Redis")
	}
	if testing.Short() {
		t.Skip("a minute of real time")
	}
	full := os.Getenv("QUOTAPLANE_TOXI_MATRIX") == "full"
	faults, fault, after, tenants := toxiFaults(full), 2*time.Second, 3*time.Second, 4
	modes := []string{"central", "local-reconciled"}
	if full {
		fault, after, tenants = 5*time.Second, 5*time.Second, 8
	}
	if m := os.Getenv("QUOTAPLANE_TOXI_MODES"); m != "" {
		modes = strings.Split(m, ",")
	}
	bins := build(t, "enforcer")
	r := redistest.Start(t)
	var rows []string
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			f := startToxiFleet(t, bins["enforcer"], r, mode, 2, tenants)
			for _, flt := range faults {
				t.Run(flt.name, func(t *testing.T) {
					res := f.run(t, flt, fault, after)
					rows = append(rows, res.row(mode, flt))
					res.check(t, mode, flt)
				})
			}
		})
	}
	t.Log("fault | mode | decisions | max latency | 5xx/errors | admitted (bound) | overage | episodes | recovery | log lines/s\n" + strings.Join(rows, "\n"))
	if path := os.Getenv("QUOTAPLANE_TOXI_TABLE"); path != "" {
		if err := os.WriteFile(path, []byte(strings.Join(rows, "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// Fault classes: how much of the fleet loses Redis, which sets the
// overage the docs allow (toxiBound).
const (
	faultNone    = iota // Redis answers within the deadline
	faultFleet          // every node loses Redis (or flaps)
	faultOneNode        // one node of N is cut off, the others keep Redis
)

// toxiFault is one fault on the Redis links: inject and heal it on a
// node's proxy; all says whether every node's link gets it or only the
// first node's.
type toxiFault struct {
	name   string
	class  int
	all    bool
	inject func(t *testing.T, p *toxiproxy.Proxy)
	heal   func(t *testing.T, p *toxiproxy.Proxy)
}

func toxiFaults(full bool) []toxiFault {
	latency := func(ms, jitterMs int) toxiFault {
		name, class := fmt.Sprintf("latency %d ms", ms), faultFleet
		if jitterMs > 0 {
			name += fmt.Sprintf(" ± %d ms", jitterMs)
		}
		if ms+jitterMs < 25 {
			class = faultNone
		}
		return toxiFault{name: name, class: class, all: true,
			inject: addToxic(fmt.Sprintf(`{"name":"latency","type":"latency","stream":"downstream","attributes":{"latency":%d,"jitter":%d}}`, ms, jitterMs)),
			heal:   removeToxics("latency")}
	}
	partition := toxiFault{name: "partition of one node", class: faultOneNode,
		inject: func(t *testing.T, p *toxiproxy.Proxy) { p.Stop() },
		heal: func(t *testing.T, p *toxiproxy.Proxy) {
			if err := p.Start(); err != nil {
				t.Fatalf("restart proxy %s: %v", p.Name, err)
			}
		}}
	// Redis stops answering and the TCP connections stay up: the timeout
	// toxic with timeout 0 drops everything both ways and never closes.
	halfOpen := func(all bool) toxiFault {
		f := toxiFault{name: "half-open, every node", class: faultFleet, all: all,
			inject: func(t *testing.T, p *toxiproxy.Proxy) {
				addToxic(`{"name":"blackhole-up","type":"timeout","stream":"upstream","attributes":{"timeout":0}}`)(t, p)
				addToxic(`{"name":"blackhole-down","type":"timeout","stream":"downstream","attributes":{"timeout":0}}`)(t, p)
			},
			heal: removeToxics("blackhole-up", "blackhole-down")}
		if !all {
			f.name, f.class = "half-open, one node", faultOneNode
		}
		return f
	}
	// reset_peer resets a connection (TCP RST) at its first data, on every
	// connection a toxicity of 1, on about that share of them less.
	resets := func(toxicity float64) toxiFault {
		return toxiFault{name: fmt.Sprintf("connection resets (%.0f %% of connections)", toxicity*100), class: faultFleet, all: true,
			inject: addToxic(fmt.Sprintf(`{"name":"reset","type":"reset_peer","stream":"upstream","toxicity":%g,"attributes":{"timeout":0}}`, toxicity)),
			heal:   removeToxics("reset")}
	}
	if !full {
		return []toxiFault{latency(50, 0), partition, halfOpen(true)}
	}
	return []toxiFault{latency(5, 0), latency(50, 0), latency(500, 0), latency(25, 25), partition, resets(1), resets(0.3), halfOpen(true), halfOpen(false)}
}

func addToxic(spec string) func(t *testing.T, p *toxiproxy.Proxy) {
	return func(t *testing.T, p *toxiproxy.Proxy) {
		if _, err := p.Toxics.AddToxicJson(strings.NewReader(spec)); err != nil {
			t.Fatalf("proxy %s: add toxic %s: %v", p.Name, spec, err)
		}
	}
}

func removeToxics(names ...string) func(t *testing.T, p *toxiproxy.Proxy) {
	return func(t *testing.T, p *toxiproxy.Proxy) {
		for _, name := range names {
			if err := p.Toxics.RemoveToxic(context.Background(), name); err != nil {
				t.Fatalf("proxy %s: remove toxic %s: %v", p.Name, name, err)
			}
		}
	}
}

// toxiFleet is N enforcer processes in one mode, each reaching Redis
// through its own proxy.
type toxiFleet struct {
	tenants int // how many the load runs
	nodes   []*enforcerNode
	procs   []*process
	proxies []*toxiproxy.Proxy
}

func startToxiFleet(t *testing.T, bin string, r *redistest.Server, mode string, n, tenants int) *toxiFleet {
	server := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop())
	samples := filepath.Join(testenv.Root(), "config", "samples")
	f := &toxiFleet{tenants: tenants}
	for i := range n {
		id := fmt.Sprintf("toxi-%s-%d", mode, i)
		p := toxiproxy.NewProxy(server, id, "127.0.0.1:0", r.Addr)
		if err := p.Start(); err != nil {
			t.Fatalf("proxy %s: %v", id, err)
		}
		t.Cleanup(p.Stop)
		e := &enforcerNode{id: id, api: "127.0.0.1:" + freePort(t), admin: "127.0.0.1:" + freePort(t)}
		f.procs = append(f.procs, start(t, bin, []string{"QUOTAPLANE_REDIS_PASSWORD=" + r.Password},
			"-policy", samples, "-mode", mode, "-redis-addr", p.Listen, "-node-id", id,
			"-listen", e.api, "-admin-listen", e.admin, "-grpc-listen", "127.0.0.1:0", "-drain", "0s"))
		f.nodes = append(f.nodes, e)
		f.proxies = append(f.proxies, p)
	}
	for _, e := range f.nodes {
		poll.Until(t, 30*time.Second, e.id+" is ready", func() bool { return e.get(t, "/readyz") == http.StatusOK })
	}
	poll.Until(t, 10*time.Second, "every node counts the fleet", func() bool {
		for _, e := range f.nodes {
			if backendOf(t, e).nodes != float64(n) {
				return false
			}
		}
		return true
	})
	return f
}

// The load: fresh free-tier tenants, each offered twice its limit.
const (
	toxiRate          = 50.0  // the free tier's tenant limit, tokens/s
	toxiBurst         = 100.0 // and its burst
	toxiOffered       = 2 * toxiRate
	toxiRedisDeadline = 50 * time.Millisecond // the engine's default WithRedisTimeout
	// toxiMargin is what a decision may take beyond the Redis deadline on
	// a loaded 2-core machine: HTTP, scheduling, the race-built load and
	// proxy. Beside make test's other packages (a load average of 9) the
	// slowest decisions took up to 0.6 s; on a quiet machine 0.1 s. A hang
	// (go-redis's 3 s read timeout, a stuck batch) is beyond it.
	toxiMargin = time.Second
	toxiWindow = 500 * time.Millisecond
	// toxiLoss is how much below rate × time + burst the tenants may get:
	// local-reconciled keeps 2 % of every limit evenly over the nodes and
	// stays 0.3-1.5 % under it without faults (docs/modes.md); a cell of
	// 6 s counts the pay-back of the last reconcile more.
	toxiLoss = 0.08
)

// toxiResult is one cell's measurements.
type toxiResult struct {
	tenants                               int
	decisions, failed, serverErrors, shed int
	maxLatency, p99                       time.Duration
	admitted                              int64
	elapsed, fault                        time.Duration
	recovery                              time.Duration // -1: not recovered
	logLinesPerSec                        float64
	// windows are the tokens admitted in each half second, by node.
	windows [][]int
	// episodes counts, over the nodes, the times a node decided on its
	// own: each time it entered degraded operation (its log line), and
	// once for a node that made failure-mode decisions without (a call
	// that timed out alone).
	episodes int
}

// run runs one cell: load, the fault from one second in for fault, healed,
// the load on for after.
func (f *toxiFleet) run(t *testing.T, flt toxiFault, fault, after time.Duration) toxiResult {
	run := strconv.FormatInt(time.Now().UnixNano()%1e9, 36)
	tenants := make([]string, f.tenants)
	for i := range tenants {
		tenants[i] = fmt.Sprintf("toxi-%s-%d", run, i)
	}
	targets := f.proxies[:1]
	if flt.all {
		targets = f.proxies
	}

	var (
		mu        sync.Mutex
		latencies []time.Duration
		res       = toxiResult{tenants: f.tenants}
	)
	var admitted atomic.Int64
	logged := make([]int, len(f.procs))
	fallbacks := make([]float64, len(f.nodes))
	for i, p := range f.procs {
		logged[i] = len(p.output())
		fallbacks[i] = backendOf(t, f.nodes[i]).fallbacks
	}
	res.windows = make([][]int, int((time.Second+fault+after)/toxiWindow)+4)
	for i := range res.windows {
		res.windows[i] = make([]int, len(f.nodes))
	}
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 1024}}
	defer client.CloseIdleConnections()
	total := float64(len(tenants)) * toxiOffered
	inflight := make(chan struct{}, 1024)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	begin := time.Now()
	wg.Go(func() {
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for sent := 0; ; {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			for due := int(time.Since(begin).Seconds() * total); sent < due; sent++ {
				select {
				case inflight <- struct{}{}:
				default:
					mu.Lock()
					res.shed++
					mu.Unlock()
					continue
				}
				tenant, n := tenants[sent%len(tenants)], sent/len(tenants)%len(f.nodes)
				node := f.nodes[n]
				wg.Go(func() {
					defer func() { <-inflight }()
					req, _ := http.NewRequest(http.MethodPost, "http://"+node.api+"/api/read", nil)
					req.Header.Set("X-Tenant", tenant)
					req.Header.Set("X-Api-Key", tenant+"-key")
					t0 := time.Now()
					resp, err := client.Do(req)
					took := time.Since(t0)
					mu.Lock()
					defer mu.Unlock()
					res.decisions++
					latencies = append(latencies, took)
					switch {
					case err != nil:
						res.failed++
						return
					case resp.StatusCode >= 500:
						res.serverErrors++
					case resp.StatusCode == http.StatusOK:
						admitted.Add(1) // read costs 1
						res.windows[min(int(t0.Sub(begin)/toxiWindow), len(res.windows)-1)][n]++
					}
					resp.Body.Close()
				})
			}
		}
	})

	<-time.After(time.Second)
	lines := f.logLines()
	injected := time.Now()
	for _, p := range targets {
		flt.inject(t, p)
	}
	<-time.After(fault)
	for _, p := range targets {
		flt.heal(t, p)
	}
	healed := time.Now()
	res.fault = healed.Sub(injected)
	res.logLinesPerSec = float64(f.logLines()-lines) / res.fault.Seconds()
	res.recovery = f.recovery(t, healed, after)
	if left := after - time.Since(healed); left > 0 {
		<-time.After(left)
	}
	close(stop)
	res.elapsed = time.Since(begin)
	wg.Wait()
	res.admitted = admitted.Load()
	for i, p := range f.procs {
		entries := strings.Count(p.output()[logged[i]:], "quota store unavailable")
		if entries == 0 && backendOf(t, f.nodes[i]).fallbacks > fallbacks[i] {
			entries = 1
		}
		res.episodes += entries
	}
	slices.Sort(latencies)
	if n := len(latencies); n > 0 {
		res.maxLatency, res.p99 = latencies[n-1], latencies[(n*99+99)/100-1]
	}
	return res
}

// logLines counts the lines the fleet's processes printed so far.
func (f *toxiFleet) logLines() int {
	n := 0
	for _, p := range f.procs {
		n += strings.Count(p.output(), "\n")
	}
	return n
}

// recovery is how long after healed every node is out of degraded
// operation and deciding through Redis again: from the heal to each
// node's first scrape (every 25 ms) after its last one that showed it
// degraded, or its failed calls or failure-mode decisions grown, provided
// that for the 400 ms since (two reconcile intervals) it stayed so and its
// script calls grew. -1 if that is not so within within.
func (f *toxiFleet) recovery(t *testing.T, healed time.Time, within time.Duration) time.Duration {
	const poll, stable = 25 * time.Millisecond, 400 * time.Millisecond
	type node struct {
		last     backendMetrics
		good     time.Time // the first scrape after the last bad one
		goodCall float64   // its script calls then
	}
	nodes := make([]node, len(f.nodes))
	for i, e := range f.nodes {
		nodes[i].last = backendOf(t, e)
	}
	for time.Since(healed) < within {
		<-time.After(poll)
		done := true
		var recovered time.Duration
		for i, e := range f.nodes {
			n := &nodes[i]
			b, now := backendOf(t, e), time.Now()
			if b.degraded != 0 || b.failures != n.last.failures || b.fallbacks != n.last.fallbacks {
				n.good = time.Time{}
			} else if n.good.IsZero() {
				n.good, n.goodCall = now, b.calls
			}
			n.last = b
			done = done && !n.good.IsZero() && now.Sub(n.good) >= stable && b.calls > n.goodCall
			recovered = max(recovered, n.good.Sub(healed))
		}
		if done {
			return max(recovered, 0)
		}
	}
	return -1
}

// backendMetrics are a node's backend metrics from /metrics.
type backendMetrics struct{ degraded, nodes, calls, failures, fallbacks float64 }

func backendOf(t *testing.T, e *enforcerNode) backendMetrics {
	var b backendMetrics
	fields := map[string]*float64{
		"quotaplane_enforcer_backend_degraded":             &b.degraded,
		"quotaplane_enforcer_fleet_nodes":                  &b.nodes,
		"quotaplane_enforcer_redis_script_calls_total":     &b.calls,
		"quotaplane_enforcer_redis_script_failures_total":  &b.failures,
		"quotaplane_enforcer_failure_mode_decisions_total": &b.fallbacks,
	}
	sc := bufio.NewScanner(strings.NewReader(e.body(t, "/metrics")))
	for sc.Scan() {
		name, value, ok := strings.Cut(sc.Text(), " ")
		name, _, _ = strings.Cut(name, "{")
		if p := fields[name]; ok && p != nil {
			*p, _ = strconv.ParseFloat(value, 64)
		}
	}
	return b
}

// toxiBound is the most the fleet may admit in a cell, in tokens, summed
// over its tenants: rate × time + burst, and what the fault adds by
// design (docs/reliability.md):
//
//   - Redis within the deadline: nothing; the limit is exact in central,
//     within 5 % of rate × time in local-reconciled (docs/modes.md).
//   - each time a node decides on its own (an episode: it enters
//     degraded operation, or a call times out alone), it may admit its
//     share of a burst (burst / N) that is not paid back: its debt is
//     capped by what its local bucket lacks, and the fleet's bucket
//     refilled meanwhile. So a fleet-wide outage costs one burst, as
//     TestCentralOutage's bound says, and so does a blip of the machine
//     that times out every node's calls at once.
//   - one node of N cut off while the others keep Redis: they keep the
//     whole limit and the cut node decides on its share (1/N) until it
//     recovers, which central does not pay back (the debt's cap, above):
//     rate × (fault + recovery) / N more. local-reconciled pays it back.
func toxiBound(mode string, flt toxiFault, r toxiResult, nodes int) float64 {
	secs := r.elapsed.Seconds()
	bound := toxiRate*secs + toxiBurst + float64(r.episodes)*toxiBurst/float64(nodes)
	if mode == "local-reconciled" {
		bound += 0.05 * toxiRate * secs
	}
	if flt.class == faultOneNode {
		bound += toxiRate * (r.fault + max(r.recovery, 0)).Seconds() / float64(nodes)
	}
	return bound * float64(r.tenants)
}

func (r toxiResult) row(mode string, flt toxiFault) string {
	bound := toxiBound(mode, flt, r, 2)
	limit := (toxiRate*r.elapsed.Seconds() + toxiBurst) * float64(r.tenants)
	recovery := "not within the run"
	if r.recovery >= 0 {
		recovery = r.recovery.Round(10 * time.Millisecond).String()
	}
	return fmt.Sprintf("%s | %s | %d | %s (p99 %s) | %d / %d | %d (limit %.0f, bound %.0f) | %+.1f %% | %d | %s | %.1f",
		flt.name, mode, r.decisions, r.maxLatency.Round(time.Millisecond), r.p99.Round(time.Millisecond), r.serverErrors, r.failed+r.shed,
		r.admitted, limit, bound, 100*(float64(r.admitted)/limit-1), r.episodes, recovery, r.logLinesPerSec)
}

func (r toxiResult) check(t *testing.T, mode string, flt toxiFault) {
	t.Helper()
	t.Logf("%s, %s: %d decisions in %s (fault %s), slowest %s (p99 %s), %d 5xx, %d failed, %d shed by the client; admitted %d; %d episodes on its own; recovered after %s; %.1f log lines/s during the fault",
		flt.name, mode, r.decisions, r.elapsed.Round(time.Millisecond), r.fault.Round(time.Millisecond), r.maxLatency, r.p99,
		r.serverErrors, r.failed, r.shed, r.admitted, r.episodes, r.recovery, r.logLinesPerSec)
	if testing.Verbose() {
		var b strings.Builder
		for i, w := range r.windows {
			fmt.Fprintf(&b, " %s:%v", time.Duration(i)*toxiWindow, w)
		}
		t.Logf("admitted per %s by node:%s", toxiWindow, b.String())
	}
	if want := int(0.9 * toxiOffered * float64(r.tenants) * r.elapsed.Seconds()); r.decisions < want {
		t.Errorf("%d decisions answered; want at least %d (90 %% of those offered)", r.decisions, want)
	}
	if r.serverErrors != 0 || r.failed != 0 || r.shed != 0 {
		t.Errorf("%d 5xx, %d requests failed, %d shed by the client; want none", r.serverErrors, r.failed, r.shed)
	}
	if r.maxLatency > toxiRedisDeadline+toxiMargin {
		t.Errorf("the slowest decision took %s; the Redis deadline is %s (margin %s)", r.maxLatency, toxiRedisDeadline, toxiMargin)
	}
	if bound := toxiBound(mode, flt, r, 2); float64(r.admitted) > bound {
		t.Errorf("admitted %d tokens; the bound is %.0f", r.admitted, bound)
	}
	// Nothing lost: the tenants, offered twice their limit, get it but
	// for toxiLoss. A debt paid twice, a node that stays degraded, or an
	// outage's refill lost take more: in local-reconciled, before
	// TestReconciledOutageDoesNotStarveTenantsUnderTheirLimit's fixes,
	// tenants at their limits got nothing for 1 to 2 s after an outage of
	// the whole fleet (-13 to -19 % of a cell).
	if floor := (1 - toxiLoss) * (toxiRate*r.elapsed.Seconds() + toxiBurst) * float64(r.tenants); float64(r.admitted) < floor {
		t.Errorf("admitted %d tokens; want at least %.0f (rate × time + burst, less %.0f %%)", r.admitted, floor, 100*toxiLoss)
	}
	if r.recovery < 0 {
		t.Errorf("the fleet was not out of degraded operation and deciding through Redis within the run")
	}
}
