// Command rlsbench offers load to a rate limit service: Envoy's
// envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit, the call
// Envoy's ratelimit filter makes, from a fixed number of concurrent callers
// (a closed model: each sends its next request when the last is answered)
// for a duration after a warmup. It reports decisions per second, latency
// quantiles, the answers by code, its own CPU time per decision and, given
// the server's (and Redis's) process ids, theirs.
//
// Each request is in domain -domain and carries -descriptors descriptors,
// each the entries tenant and api_key of one tenant (uniform over -tenants)
// and that many of its keys (of -keys). It is what hack/rlsbench/run.sh
// offers both to envoyproxy/ratelimit and to quotaplane's enforcer.
//
//	go run ./hack/rlsbench -addr 127.0.0.1:8081 -duration 10s -descriptors 4 -pid $(pgrep -n enforcer)
//
// The summary is one line of name=value fields, for scripts:
//
//	decisions_per_s=… p50_us=… p99_us=… ok=… over_limit=… errors=… server_cpu_us_per_decision=…
//
// rlsbench -free-ports N prints N free loopback TCP ports and exits;
// rlsbench -table FILE prints the medians of such lines, each prefixed
// with arm=NAME, by descriptor count and arm, with each arm's ratio to
// -base.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/bits"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:8081", "the rate limit service's gRPC address, host:port")
	domain := flag.String("domain", "main", "the requests' domain (quotaplane: the QuotaPlane's name)")
	streams := flag.Int("streams", 64, "concurrent callers, each with one request in flight")
	conns := flag.Int("conns", 4, "gRPC connections the callers share (Envoy keeps one per worker thread)")
	duration := flag.Duration("duration", 10*time.Second, "how long to measure")
	warmup := flag.Duration("warmup", 2*time.Second, "how long to offer load before measuring")
	descriptors := flag.Int("descriptors", 1, "descriptors per request, each a (tenant, api_key) pair of the same tenant")
	tenants := flag.Int("tenants", 1000, "distinct tenants")
	keys := flag.Int("keys", 10, "distinct api keys per tenant")
	pid := flag.Int("pid", 0, "the server's process id: report its CPU time per decision (Linux /proc)")
	redisPid := flag.Int("redis-pid", 0, "Redis's process id: report its CPU time per decision too")
	timeout := flag.Duration("timeout", time.Second, "deadline of one call")
	freePorts := flag.Int("free-ports", 0, "print this many free loopback TCP ports and exit")
	table := flag.String("table", "", "print the medians of the summary lines in this file (each with arm=NAME), by descriptors and arm, and exit")
	base := flag.String("base", "peer", "with -table: the arm the others are compared with")
	flag.Parse()

	if *freePorts > 0 {
		if err := printFreePorts(*freePorts); err != nil {
			fatalf("%v", err)
		}
		return
	}
	if *table != "" {
		f, err := os.Open(*table)
		if err != nil {
			fatalf("%v", err)
		}
		runs, err := parseRuns(f)
		f.Close()
		if err != nil {
			fatalf("%s: %v", *table, err)
		}
		printTable(os.Stdout, runs, *base)
		return
	}
	switch {
	case *streams < 1 || *conns < 1 || *descriptors < 1 || *tenants < 1 || *keys < 1:
		fatalf("-streams, -conns, -descriptors, -tenants and -keys must be at least 1")
	case *descriptors > *keys:
		fatalf("-descriptors %d needs at least as many -keys per tenant", *descriptors)
	case *duration <= 0:
		fatalf("-duration must be positive")
	}

	clients := make([]rlsv3.RateLimitServiceClient, *conns)
	for i := range clients {
		// One connection each: grpc.NewClient shares nothing between them.
		cc, err := grpc.NewClient(*addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			fatalf("connecting to %s: %v", *addr, err)
		}
		defer cc.Close()
		clients[i] = rlsv3.NewRateLimitServiceClient(cc)
	}
	if err := probe(clients[0], *domain, *timeout); err != nil {
		fatalf("%s does not answer ShouldRateLimit: %v", *addr, err)
	}

	var phase atomic.Int32 // 0 warmup, 1 measuring, 2 done
	results := make([]*callerResult, *streams)
	var wg sync.WaitGroup
	for i := range *streams {
		results[i] = &callerResult{}
		gen := newRequests(*domain, *descriptors, *tenants, *keys, uint64(i))
		c := clients[i%len(clients)]
		wg.Go(func() { call(c, gen, *timeout, &phase, results[i]) })
	}
	time.Sleep(*warmup) // the load generator's own schedule, not a test's wait
	cpu0, err := cpuTimes(*pid, *redisPid, os.Getpid())
	if err != nil {
		fatalf("%v", err)
	}
	start := time.Now()
	phase.Store(1)
	time.Sleep(*duration)
	phase.Store(2)
	elapsed := time.Since(start)
	cpu1, err := cpuTimes(*pid, *redisPid, os.Getpid())
	if err != nil {
		fatalf("%v", err)
	}
	wg.Wait()

	var total callerResult
	for _, r := range results {
		total.add(r)
	}
	decisions := total.ok + total.overLimit
	fields := []string{
		fmt.Sprintf("decisions_per_s=%.0f", float64(decisions)/elapsed.Seconds()),
		fmt.Sprintf("p50_us=%.1f", total.latency.quantile(0.50)),
		fmt.Sprintf("p99_us=%.1f", total.latency.quantile(0.99)),
		fmt.Sprintf("ok=%d", total.ok),
		fmt.Sprintf("over_limit=%d", total.overLimit),
		fmt.Sprintf("errors=%d", total.errors),
		fmt.Sprintf("descriptors=%d", *descriptors),
		fmt.Sprintf("streams=%d", *streams),
		fmt.Sprintf("seconds=%.2f", elapsed.Seconds()),
	}
	for i, name := range []string{"server", "redis", "rlsbench"} {
		if cpu0[i] >= 0 && decisions > 0 {
			used := cpu1[i] - cpu0[i]
			fields = append(fields,
				fmt.Sprintf("%s_cpu_s=%.2f", name, used.Seconds()),
				fmt.Sprintf("%s_cpu_us_per_decision=%.2f", name, float64(used.Microseconds())/float64(decisions)))
		}
	}
	fmt.Println(strings.Join(fields, " "))
	if total.firstError != nil {
		fmt.Fprintf(os.Stderr, "rlsbench: %d errors, the first: %v\n", total.errors, total.firstError)
	}
	if decisions == 0 {
		os.Exit(1)
	}
}

func fatalf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "rlsbench: "+format+"\n", args...)
	os.Exit(2)
}

// probe sends one request and wants a decision.
func probe(c rlsv3.RateLimitServiceClient, domain string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*timeout)
	defer cancel()
	resp, err := c.ShouldRateLimit(ctx, newRequests(domain, 1, 1, 1, 0).next(), grpc.WaitForReady(true))
	if err != nil {
		return err
	}
	if resp.GetOverallCode() == rlsv3.RateLimitResponse_UNKNOWN {
		return errors.New("overall code UNKNOWN")
	}
	return nil
}

// requests cycles through prebuilt requests, so the callers measure the
// service rather than building messages.
type requests struct {
	all []*rlsv3.RateLimitRequest
	i   int
}

const requestsPerCaller = 4096

func newRequests(domain string, descriptors, tenants, keys int, seed uint64) *requests {
	rng := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
	rs := &requests{all: make([]*rlsv3.RateLimitRequest, requestsPerCaller)}
	for i := range rs.all {
		tenant := "tenant-" + strconv.Itoa(rng.IntN(tenants))
		first := rng.IntN(keys)
		req := &rlsv3.RateLimitRequest{Domain: domain, HitsAddend: 1}
		for d := range descriptors {
			req.Descriptors = append(req.Descriptors, &ratelimitv3.RateLimitDescriptor{
				Entries: []*ratelimitv3.RateLimitDescriptor_Entry{
					{Key: "tenant", Value: tenant},
					{Key: "api_key", Value: "key-" + strconv.Itoa((first+d)%keys)},
				},
			})
		}
		rs.all[i] = req
	}
	return rs
}

func (rs *requests) next() *rlsv3.RateLimitRequest {
	r := rs.all[rs.i]
	rs.i = (rs.i + 1) % len(rs.all)
	return r
}

// callerResult is what one caller counted while measuring; only its caller
// writes it, read after the callers are done.
type callerResult struct {
	ok, overLimit, errors int64
	firstError            error
	latency               histogram
}

func (r *callerResult) add(o *callerResult) {
	r.ok += o.ok
	r.overLimit += o.overLimit
	r.errors += o.errors
	if r.firstError == nil {
		r.firstError = o.firstError
	}
	r.latency.merge(&o.latency)
}

func call(c rlsv3.RateLimitServiceClient, gen *requests, timeout time.Duration, phase *atomic.Int32, out *callerResult) {
	for {
		p := phase.Load()
		if p == 2 {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		t0 := time.Now()
		resp, err := c.ShouldRateLimit(ctx, gen.next())
		latency := time.Since(t0)
		cancel()
		if p != 1 {
			continue
		}
		switch {
		case err != nil:
			out.errors++
			if out.firstError == nil {
				out.firstError = err
			}
			continue
		case resp.GetOverallCode() == rlsv3.RateLimitResponse_OK:
			out.ok++
		case resp.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT:
			out.overLimit++
		default:
			out.errors++
			if out.firstError == nil {
				out.firstError = fmt.Errorf("overall code %v", resp.GetOverallCode())
			}
			continue
		}
		out.latency.record(latency)
	}
}

// histogram counts latencies in buckets of at most 1/32 of their value
// (3% relative error): exact below 64 ns, then 32 buckets per power of two.
type histogram struct {
	counts [64 * 32]int64
	n      int64
}

const subBuckets = 32

func bucketOf(ns int64) int {
	if ns < 2*subBuckets {
		return int(max(ns, 0))
	}
	exp := bits.Len64(uint64(ns)) - 6 // ns >> exp is in [32, 64)
	return exp*subBuckets + int(ns>>exp)
}

// bucketValue is the middle of bucket b, in ns.
func bucketValue(b int) float64 {
	if b < 2*subBuckets {
		return float64(b)
	}
	exp := b/subBuckets - 1
	mantissa := b%subBuckets + subBuckets
	return (float64(mantissa) + 0.5) * float64(int64(1)<<exp)
}

func (h *histogram) record(d time.Duration) {
	h.counts[min(bucketOf(d.Nanoseconds()), len(h.counts)-1)]++
	h.n++
}

func (h *histogram) merge(o *histogram) {
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.n += o.n
}

// quantile returns the q-quantile in µs.
func (h *histogram) quantile(q float64) float64 {
	if h.n == 0 {
		return 0
	}
	rank := int64(q * float64(h.n-1))
	var seen int64
	for b, c := range h.counts {
		seen += c
		if seen > rank {
			return bucketValue(b) / 1e3
		}
	}
	return bucketValue(len(h.counts)-1) / 1e3
}

// cpuTimes reads the user+system CPU time of each pid (0: -1).
func cpuTimes(pids ...int) ([]time.Duration, error) {
	out := make([]time.Duration, len(pids))
	for i, pid := range pids {
		out[i] = -1
		if pid == 0 {
			continue
		}
		t, err := processCPU(pid)
		if err != nil {
			return nil, err
		}
		out[i] = t
	}
	return out, nil
}

// clockTicksPerSecond is USER_HZ, 100 on every Linux architecture Go runs
// on (sysconf(_SC_CLK_TCK) without cgo).
const clockTicksPerSecond = 100

// processCPU reads utime+stime of a process from /proc/<pid>/stat.
func processCPU(pid int) (time.Duration, error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, fmt.Errorf("reading the CPU time of process %d: %w", pid, err)
	}
	// The command name (field 2) is in parentheses and may hold spaces; the
	// fields after its closing parenthesis start at field 3 (state).
	s := string(data)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(fields) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat has %d fields after the command", pid, len(fields))
	}
	var ticks int64
	for _, f := range fields[11:13] { // utime (14) and stime (15)
		v, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/%d/stat: %w", pid, err)
		}
		ticks += v
	}
	return time.Duration(ticks) * time.Second / clockTicksPerSecond, nil
}

func printFreePorts(n int) error {
	var listeners []net.Listener
	defer func() {
		for _, l := range listeners {
			l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		listeners = append(listeners, l)
		fmt.Println(l.Addr().(*net.TCPAddr).Port)
	}
	return nil
}
