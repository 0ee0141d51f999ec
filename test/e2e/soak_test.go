package e2e

// Issue 17's soak: the whole chain under steady load while everything
// around it churns, for QUOTAPLANE_SOAK (a Go duration; 60s in make test,
// hack/chaos/soak.sh runs 5m or 1h), with every period a fixed part of it
// (the hour: a policy edit every 10 s, Redis restarted every 5
// minutes, an enforcer every 10). What must stay flat is read at the same
// phase each time, just before each Redis restart, and the first three
// readings are compared with the last three.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/quotaplane/quotaplane/api/v1alpha1"
	"github.com/quotaplane/quotaplane/pkg/poll"
	"github.com/quotaplane/quotaplane/pkg/redistest"
	"github.com/quotaplane/quotaplane/pkg/store"
	"github.com/quotaplane/quotaplane/pkg/testenv"
)

// soakDuration is QUOTAPLANE_SOAK, or a minute.
func soakDuration(t *testing.T) time.Duration {
	v := os.Getenv("QUOTAPLANE_SOAK")
	if v == "" {
		return time.Minute
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 30*time.Second {
		t.Fatalf("QUOTAPLANE_SOAK=%q: want a duration of at least 30s, such as 5m or 1h", v)
	}
	return d
}

// soakHot is the hot tenant's limit, in tokens a second and burst; the
// load offers it twice the rate.
const soakRate, soakBurst = 100, 20

// soakFleet is one plane's chain: its namespace, its enforcers (node 0
// runs throughout and is the one whose resources are read; node 1 is
// restarted) and the load on them.
type soakFleet struct {
	mode, ns string
	store    *store.Store
	nodes    []*enforcerNode
	procs    []*process
	args     [][]string
	down     atomic.Bool // node 1 is being restarted: no load to it
	load     *loadRun
}

// TestSoak runs the manager on a real API server, one Redis, and two
// enforcer processes for each of two planes (central, local-reconciled),
// each under 300 HTTP requests a second: a hot tenant at twice its limit
// and 100 tenants far under theirs. Meanwhile a TenantQuota of each plane
// is edited every soak/360 (10 s an hour; 2 s at least), Redis is killed
// and restarted empty every soak/12 and one enforcer of each plane
// restarted every soak/6 (the load routed away first, as a Service would).
//
// It fails if a request goes unanswered or gets anything but 200 or 429,
// a tenant far under its limits is denied, the hot tenant's admitted
// tokens against what its limit let through of what it asked, in the last
// quiet span (1.5 s after an event, to the next), differ from the first's
// by more than 5 points or from 100 % by more than the mode allows,
// an enforcer does not run the last edit at the end, or the goroutines,
// open files, heap (after a GC) of the manager and of each long-lived
// enforcer, or Redis's key count grow: the last three readings' median
// against the first three's. With QUOTAPLANE_SOAK_PROFILES=DIR it writes
// each process's heap profile at the first and the last reading there
// (hack/chaos/soak.sh diffs them).
func TestSoak(t *testing.T) {
	skipFaults(t)
	t.Parallel() // with the other tests that bound no timing (package doc)
	soak := soakDuration(t)
	editEvery, redisEvery, enforcerEvery := max(2*time.Second, soak/360), soak/12, soak/6
	bins := build(t, "manager", "enforcer")
	env := testenv.Start(t)
	r := redistest.Start(t)
	redisEnv := []string{"QUOTAPLANE_REDIS_PASSWORD=" + r.Password}
	ctx := context.Background()

	manager := &enforcerNode{id: "manager", admin: "127.0.0.1:" + freePort(t)} // its metrics
	managerPprof := "127.0.0.1:" + freePort(t)
	start(t, bins["manager"], redisEnv, "-kubeconfig", adminKubeconfig(t, env), "-redis-addr", r.Addr,
		"-metrics-bind-address", manager.admin, "-pprof-bind-address", managerPprof,
		"-health-probe-bind-address", "127.0.0.1:"+freePort(t), "-fleet-interval", "200ms", "-resync-interval", "1s")

	var fleets []*soakFleet
	for _, mode := range []v1alpha1.Mode{v1alpha1.ModeCentral, v1alpha1.ModeLocalReconciled} {
		f := &soakFleet{mode: string(mode), ns: "soak-" + strings.TrimPrefix(string(mode), "local-")}
		createSamples(t, env.Client, f.ns)
		setMode(t, env.Client, f.ns, mode)
		hard := true // no borrowing from the sample's burst pool
		hot := &v1alpha1.TenantQuota{Spec: v1alpha1.TenantQuotaSpec{Tenant: "hot", Tier: "standard", Hard: &hard,
			Limit: &v1alpha1.Limit{Rate: soakRate, Burst: soakBurst}}}
		hot.Name, hot.Namespace = "hot", f.ns
		if err := env.Client.Create(ctx, hot); err != nil {
			t.Fatal(err)
		}
		var err error
		if f.store, err = store.New(r.Client(), f.ns+"/main"); err != nil {
			t.Fatal(err)
		}
		poll.Until(t, 30*time.Second, "the manager publishes "+f.ns+" in mode "+f.mode, func() bool {
			p, err := f.store.Current(ctx)
			return err == nil && p.Spec().Mode == f.mode
		})
		for i := range 2 {
			e := &enforcerNode{id: f.ns + "-" + strconv.Itoa(i), api: "127.0.0.1:" + freePort(t), admin: "127.0.0.1:" + freePort(t)}
			f.args = append(f.args, []string{"-redis-addr", r.Addr, "-plane", f.ns + "/main", "-node-id", e.id,
				"-listen", e.api, "-admin-listen", e.admin, "-grpc-listen", "127.0.0.1:0",
				// What was routed to a node before its restart is answered.
				"-drain", "500ms",
				// A deadline a busy machine's scheduler does not blow (make
				// test runs the soak beside the other packages): the soak
				// measures drift and leaks; Redis's latency is toxiproxy_test.go's.
				"-redis-timeout", "500ms"})
			f.procs = append(f.procs, start(t, bins["enforcer"], redisEnv, f.args[i]...))
			f.nodes = append(f.nodes, e)
		}
		for _, e := range f.nodes {
			poll.Until(t, 30*time.Second, e.id+" is ready", func() bool { return e.get(t, "/readyz") == http.StatusOK })
		}
		fleets = append(fleets, f)
	}

	for _, f := range fleets {
		// 100 background tenants, each sending every half second or so: a
		// cycle between Redis restarts sees every one of them however busy
		// the machine, so the key count read at its end is the same.
		f.load = startLoad(loadConfig{workers: 3, hotEvery: 3, hotUnits: 2, background: 100, span: soak + 30*time.Second, noHotLog: true,
			route: func(n int) *enforcerNode {
				if f.down.Load() {
					return f.nodes[0]
				}
				return f.nodes[n%2]
			}})
	}
	clock := fleets[0].load // the schedule's times are after its start

	// The schedule, in one loop: edits, Redis restarts (read first), and
	// enforcer restarts half a Redis period after a Redis restart.
	targets := []soakTarget{{name: "manager", metrics: manager, pprof: managerPprof}}
	for _, f := range fleets {
		targets = append(targets, soakTarget{name: f.nodes[0].id, metrics: f.nodes[0], pprof: f.nodes[0].admin})
	}
	var readings []soakReading
	var events []span // each Redis or enforcer restart, from its start to its end
	profiles := os.Getenv("QUOTAPLANE_SOAK_PROFILES")
	nextEdit, nextRedis, nextEnforcer := editEvery, redisEvery, enforcerEvery+redisEvery/2
	for edits := 0; ; {
		next := min(nextEdit, nextRedis, nextEnforcer)
		if next > soak-time.Second { // nothing in the last second: the last quiet span ends the soak
			clock.at(soak)
			break
		}
		clock.at(next)
		switch next {
		case nextEdit:
			edits++
			for _, f := range fleets {
				editRate(t, env.Client, f.ns, "acme", 500+int64(edits%2))
			}
			nextEdit += editEvery
		case nextRedis:
			reading := read(t, r, targets)
			readings = append(readings, reading)
			t.Logf("%s: %s", clock.since().Round(time.Second), reading)
			if profiles != "" && len(readings) == 1 {
				saveProfiles(t, profiles, "first", targets)
			}
			from := clock.since()
			r.Restart()
			events = append(events, span{from, clock.since()})
			nextRedis += redisEvery
		case nextEnforcer:
			from := clock.since()
			for _, f := range fleets {
				f.restart(t, bins["enforcer"], redisEnv)
			}
			events = append(events, span{from, clock.since()})
			nextEnforcer += enforcerEvery
		}
	}
	if profiles != "" {
		saveProfiles(t, profiles, "last", targets)
	}
	for _, f := range fleets {
		f.load.stop()
	}

	// Every enforcer runs the last edit.
	for _, f := range fleets {
		poll.Until(t, 10*time.Second, "every enforcer of "+f.ns+" runs the plane's last version", func() bool {
			p, err := f.store.Current(ctx)
			if err != nil {
				return false
			}
			for _, e := range f.nodes {
				if readyVersion(e) != p.Version() {
					return false
				}
			}
			return true
		})
	}

	for _, f := range fleets {
		failed, bad := f.load.faults()
		if len(failed) != 0 || len(bad) != 0 {
			t.Errorf("%s: requests without an answer %v, answers neither 200 nor 429 %v; want none", f.mode, failed, bad)
		}
		admitted, denied := f.load.background()
		t.Logf("%s: background tenants %d admitted, %d denied; slowest answer %s", f.mode, admitted, denied,
			time.Duration(f.load.slowest.Load()).Round(time.Millisecond))
		if denied != 0 || admitted == 0 {
			t.Errorf("%s: tenants far under their limits were denied %d times (%d admitted); want none", f.mode, denied, admitted)
		}
		spans := quietSpans(events, soak, soakSettle)
		first, last := f.load.hotShare(spans[0]), f.load.hotShare(spans[len(spans)-1])
		t.Logf("%s: the hot tenant got %.1f%% of what its limit let through in the first quiet span (%s) and %.1f%% in the last (%s)",
			f.mode, 100*first, spans[0], 100*last, spans[len(spans)-1])
		low := 0.9 // local-reconciled keeps 2 % of each limit evenly, and its shares follow demand
		if f.mode == string(v1alpha1.ModeCentral) {
			low = 0.95
		}
		for _, share := range []float64{first, last} {
			if share < low || share > 1.05 {
				t.Errorf("%s: the hot tenant got %.1f%% of what its limit let through in a quiet span; want %.0f–105%%", f.mode, 100*share, 100*low)
			}
		}
		if d := last - first; d > 0.05 || d < -0.05 {
			t.Errorf("%s: the hot tenant's share moved %+.1f points from the first quiet span to the last; want within 5", f.mode, 100*d)
		}
	}
	checkFlat(t, readings, targets)
}

// setMode sets the sample plane's mode in ns.
func setMode(t *testing.T, c client.Client, ns string, mode v1alpha1.Mode) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		qp := &v1alpha1.QuotaPlane{}
		if err := c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "main"}, qp); err != nil {
			return err
		}
		qp.Spec.Mode = mode
		return c.Update(context.Background(), qp)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// editRate sets the rate of TenantQuota name's limit in ns.
func editRate(t *testing.T, c client.Client, ns, name string, rate int64) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		tq := &v1alpha1.TenantQuota{}
		if err := c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, tq); err != nil {
			return err
		}
		tq.Spec.Limit = &v1alpha1.Limit{Rate: rate, Burst: 2 * rate}
		return c.Update(context.Background(), tq)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// restart stops node 1 after routing the load away from it (SIGTERM: it
// answers what reached it for its drain, then exits), starts it again on
// the same addresses and routes the load back once it is ready.
func (f *soakFleet) restart(t *testing.T, bin string, env []string) {
	t.Helper()
	f.down.Store(true) // no new requests to it; those on their way it answers for -drain
	defer f.down.Store(false)
	p := f.procs[1]
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s did not exit 10 s after SIGTERM:\n%s", f.nodes[1].id, p.output())
	}
	f.procs[1] = start(t, bin, env, f.args[1]...)
	poll.Until(t, 30*time.Second, f.nodes[1].id+" is ready again", func() bool { return f.nodes[1].get(t, "/readyz") == http.StatusOK })
}

// readyVersion is the policy version e's /readyz says it runs (0: none).
func readyVersion(e *enforcerNode) int64 {
	resp, err := httpClient.Get("http://" + e.admin + "/readyz")
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	var v struct {
		PolicyVersion int64 `json:"policyVersion"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&v)
	return v.PolicyVersion
}

// soakTarget is a process whose resources the soak reads: its /metrics
// (on metrics.admin) and its /debug/pprof/ (on pprof).
type soakTarget struct {
	name    string
	metrics *enforcerNode
	pprof   string
}

// soakReading is one reading of every target and of Redis.
type soakReading struct {
	goroutines, fds, heap []float64 // by target
	redisKeys             int64
}

func (s soakReading) String() string {
	return fmt.Sprintf("goroutines %v, open files %v, heap in use after a GC (MiB) %.1f, Redis keys %d", s.goroutines, s.fds, s.heap, s.redisKeys)
}

// read reads every target's goroutines and open files (/metrics), heap
// in use after a GC (the heap profile's runtime.MemStats), and Redis's
// key count.
func read(t *testing.T, r *redistest.Server, targets []soakTarget) soakReading {
	t.Helper()
	var s soakReading
	for _, tg := range targets {
		m := tg.metrics.body(t, "/metrics")
		s.goroutines = append(s.goroutines, metricValue(t, m, "go_goroutines"))
		s.fds = append(s.fds, metricValue(t, m, "process_open_fds"))
		heap := get(t, "http://"+tg.pprof+"/debug/pprof/heap?gc=1&debug=1")
		i := strings.Index(heap, "# HeapInuse = ")
		if i < 0 {
			t.Fatalf("%s's heap profile has no HeapInuse line", tg.name)
		}
		line, _, _ := strings.Cut(heap[i+len("# HeapInuse = "):], "\n")
		v, err := strconv.ParseFloat(line, 64)
		if err != nil {
			t.Fatalf("%s's HeapInuse %q: %v", tg.name, line, err)
		}
		s.heap = append(s.heap, v/(1<<20))
	}
	var err error
	if s.redisKeys, err = r.Client().DBSize(context.Background()).Result(); err != nil {
		t.Fatalf("DBSIZE: %v", err)
	}
	return s
}

// metricValue is the value of the unlabelled metric name in a /metrics body.
func metricValue(t *testing.T, body, name string) float64 {
	t.Helper()
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%s %q: %v", name, v, err)
			}
			return f
		}
	}
	t.Fatalf("no %s in /metrics", name)
	return 0
}

// saveProfiles writes each target's heap profile (after a GC) to
// dir/<target>-<when>.pb.gz.
func saveProfiles(t *testing.T, dir, when string, targets []soakTarget) {
	t.Helper()
	for _, tg := range targets {
		resp, err := httpClient.Get("http://" + tg.pprof + "/debug/pprof/heap?gc=1")
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, tg.name+"-"+when+".pb.gz"), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// checkFlat compares the median of the last three readings with the
// first three's: goroutines and open files may grow by 10, the heap by
// 25 % and 2 MiB, Redis's keys by 20 % and 50.
func checkFlat(t *testing.T, readings []soakReading, targets []soakTarget) {
	t.Helper()
	if len(readings) < 6 {
		t.Fatalf("%d readings; want at least 6", len(readings))
	}
	median := func(get func(soakReading) float64, rs []soakReading) float64 {
		var v []float64
		for _, r := range rs {
			v = append(v, get(r))
		}
		slices.Sort(v)
		return v[len(v)/2]
	}
	first, last := readings[:3], readings[len(readings)-3:]
	check := func(what string, get func(soakReading) float64, grow, plus float64) {
		a, b := median(get, first), median(get, last)
		t.Logf("%s: %.1f in the first readings, %.1f in the last", what, a, b)
		if b > a*(1+grow)+plus {
			t.Errorf("%s grew from %.1f to %.1f; want at most %.0f %% + %.0f", what, a, b, 100*grow, plus)
		}
	}
	for i, tg := range targets {
		check(tg.name+" goroutines", func(r soakReading) float64 { return r.goroutines[i] }, 0, 10)
		check(tg.name+" open files", func(r soakReading) float64 { return r.fds[i] }, 0, 10)
		check(tg.name+" heap in use (MiB)", func(r soakReading) float64 { return r.heap[i] }, 0.25, 2)
	}
	check("Redis keys", func(r soakReading) float64 { return float64(r.redisKeys) }, 0.2, 50)
}

// span is a time range of the load, from its start.
type span struct{ from, to time.Duration }

func (s span) String() string {
	return s.from.Round(time.Second).String() + "–" + s.to.Round(time.Second).String()
}

// soakSettle is how long after an event ends the hot tenant's share is
// not measured: a Redis restarted empty hands out a fresh burst, and a
// local-reconciled node counts a restarted one out and in again within
// three reconcile intervals (600 ms).
const soakSettle = 1500 * time.Millisecond

// quietSpans are the gaps of at least a second between events (and the
// soak's start and end), less settle after each event (and the start).
func quietSpans(events []span, end, settle time.Duration) []span {
	var spans []span
	from := settle
	for _, e := range append(slices.Clone(events), span{end, end}) {
		if e.from-from >= time.Second {
			spans = append(spans, span{from, e.from})
		}
		from = e.to + settle
	}
	return spans
}

// hotShare is the hot tenant's admitted tokens in the windows wholly
// inside s against what its limit lets through of what it asked for:
// rate × time, or less when the load fell behind (a busy machine) and
// asked for less.
func (l *loadRun) hotShare(s span) float64 {
	from, to := int((s.from+loadWindow-1)/loadWindow), int(s.to/loadWindow)
	var admitted, asked int64
	for i := from; i < to && i < len(l.windows); i++ {
		w := &l.windows[i]
		admitted += w.hotTokens.Load()
		asked += w.hotTokens.Load() + w.hotDenied.Load()*int64(l.cfg.hotUnits)
	}
	limit := float64(soakRate) * (time.Duration(to-from) * loadWindow).Seconds()
	return float64(admitted) / min(float64(asked), limit)
}
