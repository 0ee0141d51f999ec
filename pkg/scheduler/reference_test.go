package scheduler

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// referenceMaxMin is the test oracle for MaxMin: progressive filling written
// the obvious way, O(n²), with no sorting and no cleverness, so that it can
// be trusted by reading it. It assumes valid input (weights > 0, floors and
// caps >= 0), which is all the tests give it.
//
//  1. Every item is granted its floor (a floor above the cap counts as the cap).
//     If the floors alone exceed the capacity, they are scaled down
//     proportionally and that is the answer.
//  2. A water level rises from 0. An item whose floor is above the water
//     waits; once the water reaches it, it grows at rate wᵢ (its allocation
//     is level·wᵢ); once it reaches its cap it is frozen. The level stops
//     when the remaining capacity is used up or nothing can grow any more.
//
// Each pass of the loop jumps the level straight to the next moment something
// changes (an item starts growing, an item freezes, or capacity runs out), so
// every pass either finishes or changes the state of at least one item.
func referenceMaxMin(capacity float64, items []Item) []float64 {
	const (
		waiting = iota // floor above the water: holding its floor
		growing        // at the water line: allocation is level·w
		frozen         // at its cap
	)
	n := len(items)
	alloc := make([]float64, n)
	floor := make([]float64, n)
	state := make([]int, n)

	sumFloors := 0.0
	for i, it := range items {
		floor[i] = math.Min(it.Floor, it.Cap)
		alloc[i] = floor[i]
		sumFloors += floor[i]
	}
	if sumFloors > capacity {
		for i := range alloc {
			alloc[i] = floor[i] / sumFloors * capacity
		}
		return alloc
	}

	for i, it := range items {
		switch {
		case floor[i] == it.Cap:
			state[i] = frozen
		case floor[i] == 0:
			state[i] = growing
		default:
			state[i] = waiting
		}
	}

	remaining := capacity - sumFloors
	level := 0.0
	for {
		rate := 0.0
		next := math.Inf(1) // next level at which some item changes state
		for i, it := range items {
			switch state[i] {
			case growing:
				rate += it.Weight
				next = math.Min(next, it.Cap/it.Weight)
			case waiting:
				next = math.Min(next, floor[i]/it.Weight)
			}
		}
		if rate > 0 {
			exhausted := level + remaining/rate
			if exhausted <= next {
				for i, it := range items {
					if state[i] == growing {
						alloc[i] = math.Min(exhausted*it.Weight, it.Cap)
					}
				}
				return alloc
			}
		}
		if math.IsInf(next, 1) {
			return alloc // everything frozen: all caps granted
		}
		for i, it := range items {
			switch {
			case state[i] == growing && next >= it.Cap/it.Weight:
				remaining -= it.Cap - alloc[i]
				alloc[i] = it.Cap
				state[i] = frozen
			case state[i] == growing:
				remaining -= next*it.Weight - alloc[i]
				alloc[i] = next * it.Weight
			case state[i] == waiting && next >= floor[i]/it.Weight:
				state[i] = growing // its allocation is its floor = next·w
			}
		}
		level = next
	}
}

// ---------------------------------------------------------------------------
// Reference machinery for the queueing disciplines.

// job is the item the queueing tests enqueue: it carries its own flow and
// cost so that what comes out can be accounted for, and a sequence number
// that identifies it and checks per-flow order.
type job struct {
	flow uint64
	cost float64
	seq  int
}

// discipline is what WFQ, DRR, the naive references and the FIFO negative
// control have in common.
type discipline interface {
	Enqueue(flow uint64, weight, cost float64, item job)
	Dequeue() (uint64, job, bool)
	Len() int
	Remove(match func(job) bool) int
}

// fifo ignores weights and costs: first come, first served. It is the
// negative control that the fairness checks must reject.
type fifo struct{ jobs []job }

func (q *fifo) Enqueue(_ uint64, _, _ float64, item job) { q.jobs = append(q.jobs, item) }
func (q *fifo) Len() int                                 { return len(q.jobs) }
func (q *fifo) Dequeue() (uint64, job, bool) {
	if len(q.jobs) == 0 {
		return 0, job{}, false
	}
	j := q.jobs[0]
	q.jobs = q.jobs[1:]
	return j.flow, j, true
}
func (q *fifo) Remove(match func(job) bool) int {
	kept := q.jobs[:0]
	for _, j := range q.jobs {
		if !match(j) {
			kept = append(kept, j)
		}
	}
	removed := len(q.jobs) - len(kept)
	q.jobs = kept
	return removed
}

// naiveWFQ is self-clocked fair queueing written as plainly as possible: a
// slice scanned linearly for the smallest (finish, seq), a lastFinish map that
// never forgets a flow, and a virtual time that never restarts. WFQ must make
// exactly the same choices; with dyadic costs and weights every tag is exact,
// so "the same" means bit for bit.
type naiveWFQ struct {
	entries     []naiveWFQEntry
	lastFinish  map[uint64]float64
	virtualTime float64
	seq         int
}

type naiveWFQEntry struct {
	finish float64
	seq    int
	job    job
}

func newNaiveWFQ() *naiveWFQ { return &naiveWFQ{lastFinish: map[uint64]float64{}} }

func (q *naiveWFQ) Enqueue(flow uint64, weight, cost float64, item job) {
	finish := math.Max(q.virtualTime, q.lastFinish[flow]) + cost/weight
	q.lastFinish[flow] = finish
	q.entries = append(q.entries, naiveWFQEntry{finish: finish, seq: q.seq, job: item})
	q.seq++
}

func (q *naiveWFQ) Len() int { return len(q.entries) }

func (q *naiveWFQ) Dequeue() (uint64, job, bool) {
	if len(q.entries) == 0 {
		return 0, job{}, false
	}
	best := 0
	for i, e := range q.entries {
		b := q.entries[best]
		if e.finish < b.finish || (e.finish == b.finish && e.seq < b.seq) {
			best = i
		}
	}
	e := q.entries[best]
	q.entries = append(q.entries[:best], q.entries[best+1:]...)
	q.virtualTime = e.finish
	return e.job.flow, e.job, true
}

// Remove un-charges cancelled work: each flow that lost items restarts from
// the larger of V and its largest remaining tag.
func (q *naiveWFQ) Remove(match func(job) bool) int {
	var kept []naiveWFQEntry
	touched := map[uint64]bool{}
	for _, e := range q.entries {
		if match(e.job) {
			touched[e.job.flow] = true
		} else {
			kept = append(kept, e)
		}
	}
	removed := len(q.entries) - len(kept)
	q.entries = kept
	for flow := range touched {
		last := q.virtualTime
		for _, e := range q.entries {
			if e.job.flow == flow {
				last = math.Max(last, e.finish)
			}
		}
		q.lastFinish[flow] = last
	}
	return removed
}

// naiveDRR is deficit round robin as the paper describes it, one item per
// Dequeue: no recycling of flow state, no skipping of idle rounds (it loops
// round after round until someone can send). DRR must make exactly the same
// choices; with integer costs, quanta and weights the deficits are exact.
type naiveDRR struct {
	quantum     float64
	queues      map[uint64][]job
	weight      map[uint64]float64
	deficit     map[uint64]float64
	active      []uint64 // round-robin order; active[0] is the flow whose turn it is
	turnStarted bool     // active[0] has already received this turn's quantum
}

func newNaiveDRR(quantum float64) *naiveDRR {
	return &naiveDRR{quantum: quantum, queues: map[uint64][]job{}, weight: map[uint64]float64{}, deficit: map[uint64]float64{}}
}

func (q *naiveDRR) Enqueue(flow uint64, weight, _ float64, item job) {
	q.weight[flow] = weight
	q.queues[flow] = append(q.queues[flow], item)
	if len(q.queues[flow]) == 1 {
		q.active = append(q.active, flow)
	}
}

func (q *naiveDRR) Len() int {
	n := 0
	for _, queue := range q.queues {
		n += len(queue)
	}
	return n
}

func (q *naiveDRR) Dequeue() (uint64, job, bool) {
	for len(q.active) > 0 {
		flow := q.active[0]
		if !q.turnStarted {
			q.deficit[flow] += q.quantum * q.weight[flow]
			q.turnStarted = true
		}
		head := q.queues[flow][0]
		if head.cost <= q.deficit[flow] {
			q.queues[flow] = q.queues[flow][1:]
			q.deficit[flow] -= head.cost
			if len(q.queues[flow]) == 0 {
				q.deficit[flow] = 0
				q.active = q.active[1:]
				q.turnStarted = false
			}
			return flow, head, true
		}
		q.active = append(q.active[1:], flow)
		q.turnStarted = false
	}
	return 0, job{}, false
}

func (q *naiveDRR) Remove(match func(job) bool) int {
	removed := 0
	var active []uint64
	for position, flow := range q.active {
		var kept []job
		for _, j := range q.queues[flow] {
			if match(j) {
				removed++
			} else {
				kept = append(kept, j)
			}
		}
		q.queues[flow] = kept
		if len(kept) == 0 {
			q.deficit[flow] = 0
			if position == 0 {
				q.turnStarted = false
			}
			continue
		}
		active = append(active, flow)
	}
	q.active = active
	return removed
}

// serviceTracker checks a pairwise fairness bound over every interval in
// which two flows are both continuously backlogged: for such flows i and j,
// D = Sᵢ/wᵢ − Sⱼ/wⱼ (S = cumulative cost served) may not move by more than
// bound(i, j) between any two instants of the interval, i.e. max D − min D
// over the interval is at most the bound. The test harness reports every
// Enqueue and Dequeue to it.
type serviceTracker struct {
	weights []float64
	served  []float64
	queued  []int
	bound   func(i, j int) float64
	// Per ordered pair i < j: whether both have been backlogged since the
	// interval began, and the range of D seen in the interval.
	inInterval [][]bool
	low, high  [][]float64
	worstRatio float64 // largest (max D − min D)/bound seen: how tight the bound is
}

func newServiceTracker(weights []float64, bound func(i, j int) float64) *serviceTracker {
	n := len(weights)
	t := &serviceTracker{weights: weights, served: make([]float64, n), queued: make([]int, n), bound: bound}
	for range n {
		t.inInterval = append(t.inInterval, make([]bool, n))
		t.low = append(t.low, make([]float64, n))
		t.high = append(t.high, make([]float64, n))
	}
	return t
}

func (t *serviceTracker) difference(i, j int) float64 {
	return t.served[i]/t.weights[i] - t.served[j]/t.weights[j]
}

func (t *serviceTracker) enqueued(flow int) {
	t.queued[flow]++
	if t.queued[flow] != 1 {
		return
	}
	for other := range t.weights { // flow just became backlogged: new intervals start now
		if other != flow && t.queued[other] > 0 {
			i, j := min(flow, other), max(flow, other)
			d := t.difference(i, j)
			t.inInterval[i][j], t.low[i][j], t.high[i][j] = true, d, d
		}
	}
}

func (t *serviceTracker) dequeued(flow int, cost float64) error {
	t.queued[flow]--
	t.served[flow] += cost
	var err error
	for other := range t.weights {
		if other == flow {
			continue
		}
		i, j := min(flow, other), max(flow, other)
		if !t.inInterval[i][j] {
			continue
		}
		d := t.difference(i, j)
		t.low[i][j] = math.Min(t.low[i][j], d)
		t.high[i][j] = math.Max(t.high[i][j], d)
		spread, bound := t.high[i][j]-t.low[i][j], t.bound(i, j)
		t.worstRatio = math.Max(t.worstRatio, spread/bound)
		if spread > bound*(1+1e-9) && err == nil {
			err = fmt.Errorf("flows %d (w=%g) and %d (w=%g): normalized service difference moved by %g within one backlogged interval, bound %g",
				i, t.weights[i], j, t.weights[j], spread, bound)
		}
		if t.queued[flow] == 0 {
			t.inInterval[i][j] = false // the interval ends with this service
		}
	}
	return err
}

// checkLongRunShares compares the service each flow received with MaxMin's
// allocation of the total service among the same weights with unbounded
// demand (i.e. in proportion to weight), to within relative tolerance.
func checkLongRunShares(weights, served []float64, tolerance float64) error {
	items := make([]Item, len(weights))
	total := 0.0
	for i, w := range weights {
		items[i] = Item{Weight: w, Cap: math.Inf(1)}
		total += served[i]
	}
	want := make([]float64, len(weights))
	MaxMin(total, items, want, nil)
	for i := range weights {
		if math.Abs(served[i]-want[i]) > tolerance*want[i] {
			return fmt.Errorf("flow %d (w=%g) served %.0f, max-min share %.0f (off by %.2f%%); all served %v, want %v",
				i, weights[i], served[i], want[i], 100*math.Abs(served[i]-want[i])/want[i], served, want)
		}
	}
	return nil
}

// simulation feeds a discipline a reproducible stream of arrivals and checks
// every dequeue against a serviceTracker. Arrivals depend only on the seed
// and, for closed-loop runs, on which flow was just served.
type simulation struct {
	weights []float64
	maxCost int // costs are uniform integers in [1, maxCost]
	seed    uint64
	// active reports whether flow f sends during step (open loop); nil means always.
	active func(flow, step int) bool
}

// openLoop: at every step each active flow enqueues one item and the
// discipline serves one. Arrivals outpace service, so the active flows stay
// backlogged and the discipline alone decides the shares. The arrival stream
// is identical whatever the discipline, which is what makes the FIFO
// negative control a fair comparison.
func (s simulation) openLoop(d discipline, tracker *serviceTracker, steps int) error {
	r := rand.New(rand.NewPCG(s.seed, 99))
	seq := 0
	var firstErr error
	for step := range steps {
		for f, w := range s.weights {
			cost := float64(1 + r.IntN(s.maxCost))
			if s.active != nil && !s.active(f, step) {
				continue
			}
			d.Enqueue(uint64(f), w, cost, job{flow: uint64(f), cost: cost, seq: seq})
			tracker.enqueued(f)
			seq++
		}
		flow, j, ok := d.Dequeue()
		if !ok {
			continue
		}
		if flow != j.flow {
			return fmt.Errorf("dequeued flow %d but item belongs to flow %d", flow, j.flow)
		}
		if err := tracker.dequeued(int(flow), j.cost); err != nil && firstErr == nil {
			firstErr = fmt.Errorf("step %d: %w", step, err)
		}
	}
	return firstErr
}

// closedLoop: every flow starts with backlog items and gets a new one each
// time one of its items is served, so every flow is backlogged throughout.
func (s simulation) closedLoop(d discipline, tracker *serviceTracker, backlog, dequeues int) error {
	r := rand.New(rand.NewPCG(s.seed, 7))
	seq := 0
	enqueue := func(f int) {
		cost := float64(1 + r.IntN(s.maxCost))
		d.Enqueue(uint64(f), s.weights[f], cost, job{flow: uint64(f), cost: cost, seq: seq})
		tracker.enqueued(f)
		seq++
	}
	for range backlog {
		for f := range s.weights {
			enqueue(f)
		}
	}
	var firstErr error
	for n := range dequeues {
		flow, j, ok := d.Dequeue()
		if !ok {
			return fmt.Errorf("dequeue %d: queue unexpectedly empty", n)
		}
		if err := tracker.dequeued(int(flow), j.cost); err != nil && firstErr == nil {
			firstErr = fmt.Errorf("dequeue %d: %w", n, err)
		}
		enqueue(int(flow))
	}
	return firstErr
}

// replayRandomOperations applies one random sequence of Enqueue, Dequeue and
// Remove to the discipline under test and to its reference, and fails at the
// first observable difference. Sixteen flows with weights 1, 2, 4, 8 and
// integer costs 0..50 come and go: the enqueue probability alternates
// between 30% and 70% every 500 operations, so the queue repeatedly builds up
// and drains to empty. After every operation invariant is called with the
// number of flows that have items queued.
func replayRandomOperations(t *testing.T, got, want discipline, seed uint64, ops int, invariant func(queuedFlows int) error) {
	t.Helper()
	r := rand.New(rand.NewPCG(seed, 1))
	queuedPerFlow := map[uint64]int{}
	seq := 0
	check := func(op int, what string) {
		t.Helper()
		if got.Len() != want.Len() {
			t.Fatalf("op %d (%s): Len %d, reference %d", op, what, got.Len(), want.Len())
		}
		if err := invariant(len(queuedPerFlow)); err != nil {
			t.Fatalf("op %d (%s): %v", op, what, err)
		}
	}
	dequeueBoth := func(op int) bool {
		t.Helper()
		gotFlow, gotJob, gotOK := got.Dequeue()
		wantFlow, wantJob, wantOK := want.Dequeue()
		if gotFlow != wantFlow || gotJob != wantJob || gotOK != wantOK {
			t.Fatalf("op %d: Dequeue = (%d, %+v, %v), reference (%d, %+v, %v)",
				op, gotFlow, gotJob, gotOK, wantFlow, wantJob, wantOK)
		}
		if gotOK {
			if queuedPerFlow[gotFlow]--; queuedPerFlow[gotFlow] == 0 {
				delete(queuedPerFlow, gotFlow)
			}
		}
		check(op, "dequeue")
		return gotOK
	}
	for op := range ops {
		enqueuePercent := 30 + 40*((op/500)%2)
		switch k := r.IntN(100); {
		case k < enqueuePercent:
			flow := uint64(r.IntN(16))
			weight := []float64{1, 2, 4, 8}[flow%4]
			cost := float64(r.IntN(51))
			j := job{flow: flow, cost: cost, seq: seq}
			seq++
			got.Enqueue(flow, weight, cost, j)
			want.Enqueue(flow, weight, cost, j)
			queuedPerFlow[flow]++
			check(op, "enqueue")
		case k < 97:
			dequeueBoth(op)
		default:
			modulus := 2 + r.IntN(6)
			residue := r.IntN(modulus)
			match := func(j job) bool { return j.seq%modulus == residue }
			gotRemoved := got.Remove(match)
			wantRemoved := want.Remove(func(j job) bool {
				if !match(j) {
					return false
				}
				if queuedPerFlow[j.flow]--; queuedPerFlow[j.flow] == 0 {
					delete(queuedPerFlow, j.flow)
				}
				return true
			})
			if gotRemoved != wantRemoved {
				t.Fatalf("op %d: Remove = %d, reference %d", op, gotRemoved, wantRemoved)
			}
			check(op, "remove")
		}
	}
	for dequeueBoth(ops) {
	}
	if len(queuedPerFlow) != 0 {
		t.Fatalf("drained, but per-flow accounting still shows %v", queuedPerFlow)
	}
}
