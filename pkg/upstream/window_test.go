package upstream_test

import (
	"math"
	"sync"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/pkg/upstream"
)

var t0 = time.Date(2026, 3, 1, 2, 17, 0, 0, time.UTC)

func ms(n int) time.Duration { return time.Duration(n) * time.Millisecond }

func probe(at time.Time, err bool, latency time.Duration) upstream.Sample {
	return upstream.Sample{At: at, Err: err, Latency: latency, Remaining: -1, Limit: -1}
}

// TestWindowSeedSpan: seed 004's window is 20 probes at 15 s; a window of 5
// minutes holds the same 20, and its error rate is the window's, not the
// seed's count since start.
func TestWindowSeedSpan(t *testing.T) {
	w := upstream.NewWindow(0, 0)
	if w.Span() != 5*time.Minute || w.Cap() != 4096 {
		t.Fatalf("defaults: span %s cap %d, want 5m0s 4096", w.Span(), w.Cap())
	}
	// 10 failed probes, then 20 good ones, every 15 s.
	var now time.Time
	for i := range 30 {
		now = t0.Add(time.Duration(i) * 15 * time.Second)
		w.Add(probe(now, i < 10, ms(100+i)))
		st := w.Stats(now)
		if wantCalls := min(i+1, 20); st.Calls != int64(wantCalls) {
			t.Fatalf("probe %d: %d calls in the window, want %d", i, st.Calls, wantCalls)
		}
	}
	st := w.Stats(now)
	if st.Errors != 0 || st.ErrorRate() != 0 {
		t.Errorf("after 20 good probes: %d errors (rate %v), want 0: the failures left the window", st.Errors, st.ErrorRate())
	}
	// Half-way: probes 5..24 are in, 5 of them failed.
	w2 := upstream.NewWindow(0, 0)
	for i := range 25 {
		w2.Add(probe(t0.Add(time.Duration(i)*15*time.Second), i < 10, ms(100)))
	}
	if got := w2.ErrorRate(t0.Add(24 * 15 * time.Second)); got != 0.25 {
		t.Errorf("error rate %v, want 0.25 (5 of 20)", got)
	}
	if !st.Newest.Equal(now) {
		t.Errorf("newest %v, want %v", st.Newest, now)
	}
}

// TestWindowP95 is seed 004's nearest rank: sorted[min(int(n·0.95), n−1)].
func TestWindowP95(t *testing.T) {
	for _, tc := range []struct {
		n    int
		want time.Duration // latencies are 1..n ms, added in reverse
	}{
		{0, 0}, {1, ms(1)}, {2, ms(2)}, {19, ms(19)}, {20, ms(20)}, {21, ms(20)}, {40, ms(39)}, {100, ms(96)}, {4096, ms(3892)},
	} {
		w := upstream.NewWindow(time.Hour, 0)
		for i := tc.n; i >= 1; i-- {
			w.Add(probe(t0, false, ms(i)))
		}
		st := w.Stats(t0)
		if st.P95 != tc.want || st.Latencies != tc.n {
			t.Errorf("n=%d: p95 %s of %d latencies, want %s", tc.n, st.P95, st.Latencies, tc.want)
		}
	}
}

func TestWindowBatch(t *testing.T) {
	w := upstream.NewWindow(time.Minute, 0)
	w.AddBatch(t0, 100, 10, []time.Duration{ms(10), ms(20), ms(30), ms(40)})
	w.AddBatch(t0, 50, 0, nil) // calls without latencies
	st := w.Stats(t0)
	if st.Calls != 150 || st.Errors != 10 || st.Latencies != 4 || st.P95 != ms(40) {
		t.Fatalf("stats %+v, want 150 calls, 10 errors, 4 latencies, p95 40ms", st)
	}
	if got := st.ErrorRate(); math.Abs(got-10.0/150) > 1e-12 {
		t.Errorf("error rate %v, want 1/15", got)
	}
	// Counts out of range are mended: n below the latencies, errors above
	// n, negative errors; nothing at all is nothing.
	m := upstream.NewWindow(time.Minute, 0)
	m.AddBatch(t0, 1, 5, []time.Duration{ms(1), ms(2), ms(-3)})
	m.AddBatch(t0, 4, -2, nil)
	m.AddBatch(t0, 0, 0, nil)
	m.AddBatch(t0, -7, 3, nil)
	st = m.Stats(t0)
	if st.Calls != 7 || st.Errors != 3 || st.Latencies != 3 || st.P95 != ms(2) {
		t.Errorf("mended stats %+v, want 7 calls (3 + 4), 3 errors, 3 latencies (a negative one as 0), p95 2ms", st)
	}
	if m.Len() != 4 {
		t.Errorf("%d records, want 4 (3 latencies, 1 batch without; empty batches add none)", m.Len())
	}
}

// TestWindowCap: past its cap the window drops the oldest records, and a
// batch's calls go with its records.
func TestWindowCap(t *testing.T) {
	w := upstream.NewWindow(time.Hour, 8)
	for i := range 20 { // the first 12 fail: the 8 kept do not
		w.Add(probe(t0.Add(time.Duration(i)*time.Second), i < 12, ms(i)))
	}
	st := w.Stats(t0.Add(20 * time.Second))
	if w.Len() != 8 || st.Calls != 8 || st.Errors != 0 || st.P95 != ms(19) {
		t.Errorf("len %d, stats %+v: want the newest 8, no errors, p95 19ms", w.Len(), st)
	}

	// 100 calls, 40 errors, 8 latencies into a window of 4: records of
	// 13, 13, 13, 13, 12, 12, 12, 12 calls and 5 errors each; the last 4
	// stay.
	b := upstream.NewWindow(time.Hour, 4)
	b.AddBatch(t0, 100, 40, []time.Duration{ms(1), ms(2), ms(3), ms(4), ms(5), ms(6), ms(7), ms(8)})
	st = b.Stats(t0)
	if st.Calls != 48 || st.Errors != 20 || st.Latencies != 4 || st.P95 != ms(8) {
		t.Errorf("stats %+v: want 48 calls, 20 errors, latencies 5..8ms", st)
	}
}

func TestWindowReading(t *testing.T) {
	w := upstream.NewWindow(time.Minute, 0)
	if _, _, ok := w.Reading(t0); ok {
		t.Fatal("an empty window has a reading")
	}
	s := probe(t0, false, ms(10))
	s.Remaining, s.Limit = 400, 1000
	w.Add(s)
	w.Add(probe(t0.Add(time.Second), false, ms(10))) // no headers: keeps 400/1000
	w.AddReading(t0.Add(2*time.Second), 900, 0)      // garbage: ignored
	w.AddReading(t0.Add(3*time.Second), 1200, 1000)  // garbage: ignored
	if r, l, ok := w.Reading(t0.Add(4 * time.Second)); !ok || r != 400 || l != 1000 {
		t.Errorf("reading %d/%d %v, want 400/1000", r, l, ok)
	}
	w.AddReading(t0.Add(10*time.Second), 300, 1000)
	w.AddReading(t0.Add(5*time.Second), 999, 1000) // late and older: ignored
	if r, _, _ := w.Reading(t0.Add(11 * time.Second)); r != 300 {
		t.Errorf("remaining %d, want 300 (the newest)", r)
	}
	// The reading expires with the span; so does everything else.
	st := w.Stats(t0.Add(70 * time.Second))
	if st.Remaining != -1 || st.Limit != -1 || !st.Empty() || st.Calls != 0 {
		t.Errorf("after the span: %+v, want empty with no reading", st)
	}
}

// TestWindowNewest: the newest time is of a sample or a reading, whatever
// order they came in; a late sample out of the span does not count.
func TestWindowNewest(t *testing.T) {
	w := upstream.NewWindow(time.Minute, 0)
	w.Add(probe(t0.Add(100*time.Second), false, ms(5)))
	w.Add(probe(t0.Add(10*time.Second), true, ms(5))) // late, behind a newer record
	w.AddReading(t0.Add(50*time.Second), 1, 2)
	now := t0.Add(100 * time.Second)
	st := w.Stats(now)
	if !st.Newest.Equal(now) || st.Calls != 1 || st.Errors != 0 || st.Remaining != 1 {
		t.Errorf("stats %+v: want newest %v, the late error out of span, reading 1/2", st, now)
	}
	if got := w.Newest(t0.Add(155 * time.Second)); !got.Equal(now) {
		t.Errorf("newest %v, want %v", got, now)
	}
	if got := w.Newest(t0.Add(160 * time.Second)); !got.IsZero() {
		t.Errorf("newest %v after the span, want zero", got)
	}
}

func TestWindowReport(t *testing.T) {
	w := upstream.NewWindow(time.Minute, 0)
	w.AddReport(t0, &upstream.Report{Node: "n1", N: 10, Errors: 2,
		LatenciesMs: []float64{12.5, 80, math.NaN(), -1, 1e12}, Remaining: 50, Limit: 100})
	w.AddReport(t0, &upstream.Report{Node: "n2", N: 10, Remaining: -1, Limit: -1})
	st := w.Stats(t0)
	if st.Calls != 20 || st.Errors != 2 || st.Latencies != 2 || st.P95 != ms(80) || st.Remaining != 50 || st.Limit != 100 {
		t.Errorf("stats %+v: want 20 calls, 2 errors, latencies 12.5 and 80 ms (garbage dropped), reading 50/100", st)
	}
}

func TestWindowZeroValue(t *testing.T) {
	var w upstream.Window
	w.Add(probe(t0, true, ms(1)))
	if st := w.Stats(t0.Add(4 * time.Minute)); st.Calls != 1 || st.Errors != 1 {
		t.Errorf("zero window: %+v, want the sample within its default 5 minutes", st)
	}
}

// TestWindowAllocs: once grown, adding and reading allocate nothing.
func TestWindowAllocs(t *testing.T) {
	w := upstream.NewWindow(time.Minute, 256)
	lat := []time.Duration{ms(1), ms(2), ms(3)}
	i := 0
	step := func() {
		at := t0.Add(time.Duration(i) * time.Second)
		w.Add(probe(at, i%3 == 0, ms(i%50)))
		w.AddBatch(at, 10, 1, lat)
		w.Stats(at)
		i++
	}
	for range 300 {
		step()
	}
	if n := testing.AllocsPerRun(100, step); n != 0 {
		t.Errorf("%v allocations per add and read, want 0", n)
	}
}

func TestWindowConcurrent(t *testing.T) {
	w := upstream.NewWindow(time.Minute, 64)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 500 {
				at := t0.Add(time.Duration(i) * time.Millisecond)
				if g%2 == 0 {
					w.Add(probe(at, false, ms(i)))
				} else {
					w.Stats(at)
				}
			}
		})
	}
	wg.Wait()
	if st := w.Stats(t0.Add(time.Second)); st.Calls != 64 {
		t.Errorf("%d calls, want the cap, 64", st.Calls)
	}
}

func BenchmarkWindowStats(b *testing.B) {
	w := upstream.NewWindow(time.Hour, 0)
	for i := range 4096 {
		w.Add(probe(t0.Add(time.Duration(i)*time.Millisecond), i%10 == 0, ms(i%500)))
	}
	b.ReportAllocs()
	for b.Loop() {
		w.Stats(t0.Add(5 * time.Second))
	}
}
