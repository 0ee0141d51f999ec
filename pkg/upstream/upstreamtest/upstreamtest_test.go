package upstreamtest_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/pkg/upstream"
	"github.com/quotaplane/quotaplane/pkg/upstream/upstreamtest"
)

var t0 = time.Date(2026, 3, 1, 2, 17, 0, 0, time.UTC)

// get sends one request to h and returns the answer.
func get(h http.Handler) *http.Response {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/v1/models", nil))
	return rec.Result()
}

// statuses sends n requests and counts their statuses.
func statuses(h http.Handler, n int) map[int]int {
	out := map[int]int{}
	for range n {
		out[get(h).StatusCode]++
	}
	return out
}

// TestTimeline: a scripted outage, step by step, in virtual time.
func TestTimeline(t *testing.T) {
	clock := upstreamtest.NewClock(t0)
	h := upstreamtest.NewHandler(upstreamtest.Timeline{
		{At: 0, Capacity: 5},
		{At: 10 * time.Second, ErrorRate: 0.25},
		{At: 20 * time.Second, Capacity: 2.5},
		{At: 30 * time.Second, ErrorRate: 1, ErrorStatus: 500, Capacity: 1},
	}, upstreamtest.Options{Clock: clock.Now, Sleep: clock.Sleep})

	// 0 s: 5 served, 3 throttled.
	if got := statuses(h, 8); got[200] != 5 || got[429] != 3 {
		t.Errorf("second 0: %v, want 5 served, 3 throttled", got)
	}
	// The next second serves 5 more.
	clock.Advance(time.Second)
	if got := statuses(h, 6); got[200] != 5 || got[429] != 1 {
		t.Errorf("second 1: %v, want 5 served, 1 throttled", got)
	}
	// 10 s: every 4th fails, no limit.
	clock.Set(t0.Add(10 * time.Second))
	var codes []int
	for range 8 {
		codes = append(codes, get(h).StatusCode)
	}
	if want := []int{200, 200, 200, 503, 200, 200, 200, 503}; !reflect.DeepEqual(codes, want) {
		t.Errorf("10 s: %v, want %v", codes, want)
	}
	// 20 s: 2.5/s is 2 then 3.
	clock.Set(t0.Add(20 * time.Second))
	if got := statuses(h, 5); got[200] != 2 || got[429] != 3 {
		t.Errorf("second 20: %v, want 2 served", got)
	}
	clock.Advance(time.Second)
	if got := statuses(h, 5); got[200] != 3 || got[429] != 2 {
		t.Errorf("second 21: %v, want 3 served", got)
	}
	// 30 s: everything admitted fails with 500.
	clock.Set(t0.Add(30 * time.Second))
	if got := statuses(h, 3); got[500] != 1 || got[429] != 2 {
		t.Errorf("second 30: %v, want 1 failed, 2 throttled", got)
	}

	secs := h.Seconds()
	if len(secs) != 31 {
		t.Fatalf("%d seconds counted, want 31", len(secs))
	}
	for i, want := range map[int]upstreamtest.Second{
		0: {Served: 5, Throttled: 3}, 1: {Served: 5, Throttled: 1}, 5: {},
		10: {Served: 6, Errors: 2}, 20: {Served: 2, Throttled: 3}, 21: {Served: 3, Throttled: 2}, 30: {Errors: 1, Throttled: 2},
	} {
		if secs[i] != want {
			t.Errorf("second %d: %+v, want %+v", i, secs[i], want)
		}
	}
	if tot := h.Totals(); tot != (upstreamtest.Second{Served: 21, Errors: 3, Throttled: 11}) || tot.Requests() != 35 {
		t.Errorf("totals %+v, want 21 served, 3 errors, 11 throttled", tot)
	}
}

// TestRateLimitHeaders: the limit is capacity × window; remaining counts
// the window's admitted requests down, 429s carry 0.
func TestRateLimitHeaders(t *testing.T) {
	clock := upstreamtest.NewClock(t0)
	h := upstreamtest.NewHandler(upstreamtest.Timeline{{Capacity: 2}}, upstreamtest.Options{Clock: clock.Now})
	var got []string
	for range 2 {
		for range 3 {
			r := get(h)
			got = append(got, r.Header.Get(upstreamtest.RemainingHeader)+"/"+r.Header.Get(upstreamtest.LimitHeader))
		}
		clock.Advance(time.Second)
	}
	if want := []string{"119/120", "118/120", "118/120", "117/120", "116/120", "116/120"}; !reflect.DeepEqual(got, want) {
		t.Errorf("per minute: %v, want %v", got, want)
	}
	clock.Set(t0.Add(90 * time.Second)) // the next window
	r := get(h)
	if got := r.Header.Get(upstreamtest.RemainingHeader); got != "119" {
		t.Errorf("remaining %s in the next window, want 119", got)
	}
	if got := r.Header.Get(upstreamtest.ResetHeader); got != "30s" {
		t.Errorf("reset %s, want 30s", got)
	}
	// Per second: the limit is the capacity.
	ps := upstreamtest.NewHandler(upstreamtest.Timeline{{Capacity: 3}}, upstreamtest.Options{Clock: clock.Now, LimitWindow: time.Second})
	got = nil
	for range 4 {
		r := get(ps)
		got = append(got, r.Header.Get(upstreamtest.RemainingHeader)+"/"+r.Header.Get(upstreamtest.LimitHeader))
	}
	if want := []string{"2/3", "1/3", "0/3", "0/3"}; !reflect.DeepEqual(got, want) {
		t.Errorf("per second: %v, want %v", got, want)
	}
	// No capacity, no headers.
	if r := get(upstreamtest.NewHandler(upstreamtest.Timeline{{}}, upstreamtest.Options{})); r.Header.Get(upstreamtest.LimitHeader) != "" {
		t.Errorf("an unlimited upstream sent %s", r.Header.Get(upstreamtest.LimitHeader))
	}
}

// TestLatency: latency delays served and failed answers, not 429s.
func TestLatency(t *testing.T) {
	clock := upstreamtest.NewClock(t0)
	h := upstreamtest.NewHandler(upstreamtest.Timeline{{Latency: 200 * time.Millisecond, Capacity: 1, ErrorRate: 0.5}}, upstreamtest.Options{Clock: clock.Now, Sleep: clock.Sleep})
	if r := get(h); r.StatusCode != 200 || !clock.Now().Equal(t0.Add(200*time.Millisecond)) {
		t.Errorf("served %d at %v, want 200 after 200ms", r.StatusCode, clock.Now().Sub(t0))
	}
	if r := get(h); r.StatusCode != 429 || !clock.Now().Equal(t0.Add(200*time.Millisecond)) {
		t.Errorf("throttled %d at %v, want 429 at once", r.StatusCode, clock.Now().Sub(t0))
	}
	clock.Advance(time.Second)
	if r := get(h); r.StatusCode != 503 || !clock.Now().Equal(t0.Add(1400*time.Millisecond)) {
		t.Errorf("failed %d at %v, want 503 after 200ms more", r.StatusCode, clock.Now().Sub(t0))
	}
}

// TestBeforeFirstStep: before the first step the upstream is healthy and
// unlimited; a clock behind the start counts in second 0.
func TestBeforeFirstStep(t *testing.T) {
	clock := upstreamtest.NewClock(t0)
	h := upstreamtest.NewHandler(upstreamtest.Timeline{{At: time.Minute, ErrorRate: 1}}, upstreamtest.Options{Clock: clock.Now})
	if got := statuses(h, 10); got[200] != 10 {
		t.Errorf("before the first step: %v, want 10 served", got)
	}
	clock.Advance(-time.Hour)
	get(h)
	clock.Set(t0.Add(time.Minute))
	if got := statuses(h, 2); got[503] != 2 {
		t.Errorf("at the first step: %v, want 2 failed", got)
	}
	if secs := h.Seconds(); len(secs) != 61 || secs[0].Served != 11 || secs[60].Errors != 2 {
		t.Errorf("seconds: %d, [0] %+v, want 61 with 11 served in the first", len(secs), secs[0])
	}
}

// TestErrorRateExact: the deterministic choice gives exact counts.
func TestErrorRateExact(t *testing.T) {
	for _, tc := range []struct {
		rate float64
		n    int
		want int
	}{{0.29, 100, 29}, {0.1, 1000, 100}, {0.125, 800, 100}, {0.999, 1000, 999}, {1, 7, 7}, {0, 50, 0}} {
		h := upstreamtest.NewHandler(upstreamtest.Timeline{{ErrorRate: tc.rate}}, upstreamtest.Options{Clock: upstreamtest.NewClock(t0).Now})
		if got := statuses(h, tc.n)[503]; got != tc.want {
			t.Errorf("rate %v over %d: %d errors, want %d", tc.rate, tc.n, got, tc.want)
		}
	}
}

func TestSecondsBounded(t *testing.T) {
	clock := upstreamtest.NewClock(t0)
	h := upstreamtest.NewHandler(upstreamtest.Timeline{{}}, upstreamtest.Options{Clock: clock.Now})
	clock.Advance(48 * time.Hour)
	get(h)
	if n := len(h.Seconds()); n != 0 || h.Totals().Served != 1 {
		t.Errorf("%d seconds kept after a request 2 days in, totals %+v: want none, 1 served", n, h.Totals())
	}
	clock.Set(t0.Add(upstreamtest.MaxSeconds*time.Second - time.Second))
	get(h)
	if n := len(h.Seconds()); n != upstreamtest.MaxSeconds {
		t.Errorf("%d seconds, want at most %d", n, upstreamtest.MaxSeconds)
	}
}

// TestConcurrent: concurrent requests in one second: exactly the capacity
// is admitted.
func TestConcurrent(t *testing.T) {
	clock := upstreamtest.NewClock(t0)
	h := upstreamtest.NewHandler(upstreamtest.Timeline{{Capacity: 100, ErrorRate: 0.1}}, upstreamtest.Options{Clock: clock.Now})
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 50 {
				get(h)
			}
		})
	}
	wg.Wait()
	if tot := h.Totals(); tot.Served != 90 || tot.Errors != 10 || tot.Throttled != 300 {
		t.Errorf("totals %+v, want 90 served, 10 failed, 300 throttled", tot)
	}
}

func TestTimelineJSON(t *testing.T) {
	data := `[
		{"at": "0s", "capacity": 10, "latency": "20ms"},
		{"at": "1m", "errorRate": 0.5, "latency": "200ms", "capacity": 2.5, "errorStatus": 500},
		{"at": "6m30s"}
	]`
	tl, err := upstreamtest.ParseTimeline([]byte(data))
	if err != nil {
		t.Fatal(err)
	}
	want := upstreamtest.Timeline{
		{At: 0, Capacity: 10, Latency: 20 * time.Millisecond},
		{At: time.Minute, ErrorRate: 0.5, Latency: 200 * time.Millisecond, Capacity: 2.5, ErrorStatus: 500},
		{At: 6*time.Minute + 30*time.Second},
	}
	if !reflect.DeepEqual(tl, want) {
		t.Errorf("parsed %+v, want %+v", tl, want)
	}
	out, err := json.Marshal(tl)
	if err != nil {
		t.Fatal(err)
	}
	if again, err := upstreamtest.ParseTimeline(out); err != nil || !reflect.DeepEqual(again, want) {
		t.Errorf("round trip %s: %+v %v", out, again, err)
	}
	for _, bad := range []string{
		`[{"at": "0s", "capacity": 10, "burst": 3}]`,
		`[{"at": "soon"}]`,
		`[{"at": "1s", "latency": "fast"}]`,
		`[{"at": "1m"}, {"at": "30s"}]`,
		`[{"at": "0s"}, {"at": "0s"}]`,
		`[{"at": "-1s"}]`,
		`[{"at": "0s", "errorRate": 1.5}]`,
		`[{"at": "0s", "capacity": -1}]`,
		`[{"at": "0s", "errorStatus": 200}]`,
		`[{"at": "0s", "latency": "1h"}]`,
		`{"at": "0s"}`,
	} {
		if _, err := upstreamtest.ParseTimeline([]byte(bad)); err == nil {
			t.Errorf("%s parsed", bad)
		}
	}
}

func TestNewPanicsOnInvalid(t *testing.T) {
	defer func() {
		if r := recover(); r == nil || !strings.Contains(r.(string), "errorRate") {
			t.Errorf("recovered %v, want a panic naming errorRate", r)
		}
	}()
	upstreamtest.New(upstreamtest.Timeline{{ErrorRate: 2}})
}

// TestServerWithProber: the pipeline's probe against a real fake upstream:
// a healthy reading, then a failing one.
func TestServerWithProber(t *testing.T) {
	ok := upstreamtest.New(upstreamtest.Timeline{{Capacity: 1000}})
	defer ok.Close()
	res := (&upstream.Prober{URL: ok.URL + "/v1/models", Timeout: time.Second}).Probe(context.Background())
	if res.Sample.Err || res.Sample.Remaining != 59_999 || res.Sample.Limit != 60_000 {
		t.Errorf("healthy: %+v, want success with 59999/60000", res)
	}
	failing := upstreamtest.New(upstreamtest.Timeline{{ErrorRate: 1, Latency: 30 * time.Millisecond}})
	defer failing.Close()
	res = (&upstream.Prober{URL: failing.URL, Timeout: time.Second}).Probe(context.Background())
	if !res.Sample.Err || res.Sample.Status != 503 || res.Sample.Latency < 30*time.Millisecond {
		t.Errorf("failing: %+v, want a 503 error sample of at least 30ms", res)
	}
	if tot := failing.Totals(); tot.Errors != 1 {
		t.Errorf("the failing upstream counted %+v, want 1 error", tot)
	}
	// A hang past the probe's timeout: the server waits out its latency
	// but lets go when the client does.
	slow := upstreamtest.New(upstreamtest.Timeline{{Latency: time.Minute}})
	defer slow.Close()
	start := time.Now()
	res = (&upstream.Prober{URL: slow.URL, Timeout: 100 * time.Millisecond}).Probe(context.Background())
	if !res.Sample.Err || res.Sample.Latency != 100*time.Millisecond || time.Since(start) > time.Second {
		t.Errorf("slow: %+v, want a timeout of 100ms", res)
	}
}
