package upstream

import (
	"slices"
	"sync"
	"time"
)

// Sample is one observation of an upstream: an active probe, or one call of
// a passive report.
type Sample struct {
	// At is when the observation ended.
	At time.Time
	// Status is the HTTP status the upstream answered; 0 when it did not.
	Status int
	// Err says the observation counts as an error: no answer, a timeout, an
	// unexpected status (a probe) or IsError (a passive call).
	Err bool
	// Latency is how long the call took (the timeout for a hang).
	Latency time.Duration
	// Remaining and Limit are the rate-limit reading the answer carried,
	// both -1 when it carried none that parsed (ParseRateLimit).
	Remaining, Limit int64
}

// Window defaults: seed 004 keeps 20 probes at 15 s, a rolling 5 minutes.
const (
	DefaultWindowSpan = 5 * time.Minute
	// DefaultWindowCap bounds the records a window keeps (one per probe,
	// one per reported latency): at most this many, the oldest dropped.
	DefaultWindowCap = 4096
)

// Window is a rolling window of one upstream's samples, bounded in time
// (Span: a sample older than that no longer counts) and in count (Cap
// records: past that the oldest is dropped). Active probes feed it one
// Sample at a time (Add), passive reports in aggregate (AddBatch,
// AddReport).
//
// A record is one call, or several calls of a batch that share one
// reported latency: a batch of n calls with k latencies becomes k records
// that split its calls and errors evenly, so the error rate is per call
// and dropping the oldest records drops their calls with them. A batch
// without latencies is one record without one.
//
// The quota reading is the newest known one (a sample's or a report's
// that parsed) while it is inside the span: a later answer without usable
// headers does not erase it, and it expires with the samples. Seed 004
// differs: its error rate counts every probe since start (a cumulative
// counter, not its 20-sample window) and its reading is the last probe's,
// defaulting a missing header to 1000/1000 (full).
//
// The zero Window is a window of the defaults. A Window is safe for
// concurrent use; the memory it holds is bounded by
// Cap, and reading it (Stats, P95) reuses one scratch buffer.
type Window struct {
	span time.Duration
	cap  int

	mu      sync.Mutex // guards everything below
	ring    []record   // grows to cap, then wraps
	head    int        // index of the oldest record
	n       int        // records held
	reading reading    // newest known quota reading
	scratch []time.Duration
}

// record is one call, or a share of a batch's calls; latency < 0 when it
// carries none.
type record struct {
	atNs    int64
	latency time.Duration
	calls   int64
	errors  int64
}

type reading struct {
	atNs             int64
	remaining, limit int64
	known            bool
}

// NewWindow returns a window of span (DefaultWindowSpan when ≤ 0) holding
// at most capacity records (DefaultWindowCap when ≤ 0).
func NewWindow(span time.Duration, capacity int) *Window {
	if span <= 0 {
		span = DefaultWindowSpan
	}
	if capacity <= 0 {
		capacity = DefaultWindowCap
	}
	return &Window{span: span, cap: capacity}
}

// Span is how long a sample counts.
func (w *Window) Span() time.Duration {
	if w.span <= 0 {
		return DefaultWindowSpan
	}
	return w.span
}

// Cap is how many records the window holds at most.
func (w *Window) Cap() int {
	if w.cap <= 0 {
		return DefaultWindowCap
	}
	return w.cap
}

// Add folds in one sample: one call, an error if s.Err, and its reading if
// it has a valid one (ValidReading).
func (w *Window) Add(s Sample) {
	var errors int64
	if s.Err {
		errors = 1
	}
	at := s.At.UnixNano()
	w.mu.Lock()
	defer w.mu.Unlock()
	w.pushLocked(record{atNs: at, latency: max(s.Latency, 0), calls: 1, errors: errors})
	w.readLocked(at, s.Remaining, s.Limit)
}

// AddBatch folds in n calls that ended around at, errors of them failed,
// with a sample of their latencies (at most n; latencies past the window's
// Cap keep only the last Cap). Counts out of range are mended, not
// trusted: n below the latencies given is raised to them, errors is
// clamped to [0, n].
func (w *Window) AddBatch(at time.Time, n, errors int, latencies []time.Duration) {
	calls := max(int64(n), int64(len(latencies)), 0)
	errs := min(max(int64(errors), 0), calls)
	if calls == 0 {
		return
	}
	atNs := at.UnixNano()
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(latencies) == 0 {
		w.pushLocked(record{atNs: atNs, latency: -1, calls: calls, errors: errs})
		return
	}
	// Split calls and errors evenly over the records, the remainders on
	// the first ones; skip the latencies that would only be dropped again.
	k := int64(len(latencies))
	skip := max(len(latencies)-w.Cap(), 0)
	for i, l := range latencies {
		c := calls / k
		if int64(i) < calls%k {
			c++
		}
		e := errs / k
		if int64(i) < errs%k {
			e++
		}
		if i < skip {
			continue
		}
		w.pushLocked(record{atNs: atNs, latency: max(l, 0), calls: c, errors: e})
	}
}

// AddReading folds in a quota reading taken at at; an invalid one
// (ValidReading) is ignored.
func (w *Window) AddReading(at time.Time, remaining, limit int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.readLocked(at.UnixNano(), remaining, limit)
}

// AddReport folds in an enforcer's passive report, taken at at (the
// leader's clock when it read the report: enforcers' clocks are not
// trusted to agree with it).
func (w *Window) AddReport(at time.Time, r *Report) {
	var buf [MaxReportLatencies]time.Duration
	lat := buf[:0]
	for _, ms := range r.LatenciesMs {
		if len(lat) == len(buf) {
			break
		}
		if ms >= 0 && ms < float64(time.Hour/time.Millisecond) {
			lat = append(lat, time.Duration(ms*float64(time.Millisecond)))
		}
	}
	w.AddBatch(at, r.N, r.Errors, lat)
	w.AddReading(at, r.Remaining, r.Limit)
}

// ValidReading says whether a quota reading can be used: a limit of 1 to
// MaxRateLimitValue and a remaining of 0 to the limit.
func ValidReading(remaining, limit int64) bool {
	return limit > 0 && limit <= MaxRateLimitValue && remaining >= 0 && remaining <= limit
}

func (w *Window) readLocked(atNs, remaining, limit int64) {
	if !ValidReading(remaining, limit) {
		return
	}
	if w.reading.known && atNs < w.reading.atNs {
		return // an older reading arriving late
	}
	w.reading = reading{atNs: atNs, remaining: remaining, limit: limit, known: true}
}

func (w *Window) pushLocked(r record) {
	if w.n == len(w.ring) && len(w.ring) < w.Cap() {
		grown := make([]record, min(max(2*len(w.ring), 64), w.Cap()))
		copied := copy(grown, w.ring[w.head:])
		copy(grown[copied:], w.ring[:w.head])
		w.ring, w.head = grown, 0
	}
	if w.n == len(w.ring) { // full: overwrite the oldest
		w.ring[w.head] = r
		w.head = (w.head + 1) % len(w.ring)
		return
	}
	w.ring[(w.head+w.n)%len(w.ring)] = r
	w.n++
}

// expireLocked drops the records at the head that are out of the span at
// now. Records behind a newer one (a late report) wait for it to expire
// first; the readers skip them.
func (w *Window) expireLocked(cutoff int64) {
	for w.n > 0 && w.ring[w.head].atNs <= cutoff {
		w.ring[w.head] = record{}
		w.head = (w.head + 1) % len(w.ring)
		w.n--
	}
	if w.reading.known && w.reading.atNs <= cutoff {
		w.reading = reading{}
	}
}

// Stats is what a window holds at one instant, the inputs of Confidence.
type Stats struct {
	// Calls counted in the window, Errors of them failed.
	Calls, Errors int64
	// Latencies is how many latencies were counted; P95 their 95th
	// percentile by seed 004's nearest rank, sorted[int(n·0.95)] (the
	// largest below 20), 0 when there are none.
	Latencies int
	P95       time.Duration
	// Remaining and Limit are the newest valid quota reading, -1 when
	// there is none.
	Remaining, Limit int64
	// Newest is the time of the newest sample or reading, zero when the
	// window is empty.
	Newest time.Time
}

// ErrorRate is Errors/Calls, 0 without calls.
func (s Stats) ErrorRate() float64 {
	if s.Calls <= 0 {
		return 0
	}
	return float64(s.Errors) / float64(s.Calls)
}

// Empty says the window holds no sample and no reading.
func (s Stats) Empty() bool { return s.Newest.IsZero() }

// Stats reads the window at now: the samples of the last span (older
// ones are dropped for good). A sample stamped after now (a clock ahead)
// counts.
func (w *Window) Stats(now time.Time) Stats {
	cutoff := now.Add(-w.Span()).UnixNano()
	w.mu.Lock()
	defer w.mu.Unlock()
	w.expireLocked(cutoff)
	st := Stats{Remaining: -1, Limit: -1}
	var newest int64
	seen := false
	lat := w.scratch[:0]
	for i := range w.n {
		r := &w.ring[(w.head+i)%len(w.ring)]
		if r.atNs <= cutoff {
			continue
		}
		st.Calls += r.calls
		st.Errors += r.errors
		if r.latency >= 0 {
			lat = append(lat, r.latency)
		}
		if !seen || r.atNs > newest {
			newest, seen = r.atNs, true
		}
	}
	if w.reading.known {
		st.Remaining, st.Limit = w.reading.remaining, w.reading.limit
		if !seen || w.reading.atNs > newest {
			newest, seen = w.reading.atNs, true
		}
	}
	if seen {
		st.Newest = time.Unix(0, newest)
	}
	st.Latencies = len(lat)
	st.P95 = p95(lat)
	w.scratch = lat
	return st
}

// p95 is seed 004's nearest-rank 95th percentile; it sorts lat.
func p95(lat []time.Duration) time.Duration {
	if len(lat) == 0 {
		return 0
	}
	slices.Sort(lat)
	return lat[min(int(float64(len(lat))*0.95), len(lat)-1)]
}

// ErrorRate is the failed share of the calls in the window at now.
func (w *Window) ErrorRate(now time.Time) float64 { return w.Stats(now).ErrorRate() }

// P95 is the 95th percentile latency in the window at now (Stats.P95).
func (w *Window) P95(now time.Time) time.Duration { return w.Stats(now).P95 }

// Reading is the newest valid quota reading in the window at now; ok false
// when there is none.
func (w *Window) Reading(now time.Time) (remaining, limit int64, ok bool) {
	st := w.Stats(now)
	return st.Remaining, st.Limit, st.Limit > 0
}

// Newest is when the newest sample or reading in the window at now was
// taken; zero when there is none.
func (w *Window) Newest(now time.Time) time.Time { return w.Stats(now).Newest }

// Len is how many records the window holds (some may be out of span until
// the next read).
func (w *Window) Len() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.n
}
