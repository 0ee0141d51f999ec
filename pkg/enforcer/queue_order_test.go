package enforcer

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/pkg/policy/policytest"
	"github.com/quotaplane/quotaplane/pkg/poll"
)

// The admission order of the queueing modes, checked at the engine: real
// waiters (Decide with a queue wait) on a contended plane, admitted one at
// a time as the global bucket refills in virtual time, against oracles
// written here from the algorithms' definitions (not pkg/scheduler's code),
// with a FIFO queue as the negative control that must fail every check.

// orderPlane has a global limit of 1000 tokens/s, tiers of weight 4 and 1 and
// tenants of weights 1 and 2 in them, shared by tier (flow weights 1, 2, 4
// and 8; by tenant they would be the tenants' own), endpoints
// of costs 1, 2 and 4, and no limit below global. The weights are powers of
// two, so that every finish tag is exact in floating point and a tie is a
// tie (WFQ breaks it by arrival): with weights such as 3, tags equal as
// rationals may differ in their last bit, depending on the order of the
// additions that made them.
const orderPlane = planeHeader + `
  global: {rate: 1000, burst: 1000}
  fairness: %s
  shareBy: tier
  defaultTier: free
  tiers:
    - {name: gold, weight: 4}
    - {name: free, weight: 1}
---
apiVersion: quotaplane.io/v1alpha1
kind: EndpointQuota
metadata: {name: read}
spec: {endpoint: read, cost: 1}
---
apiVersion: quotaplane.io/v1alpha1
kind: EndpointQuota
metadata: {name: write}
spec: {endpoint: write, cost: 2}
---
apiVersion: quotaplane.io/v1alpha1
kind: EndpointQuota
metadata: {name: export}
spec: {endpoint: export, cost: 4}
---
apiVersion: quotaplane.io/v1alpha1
kind: TenantQuota
metadata: {name: g1}
spec: {tenant: g1, tier: gold, weight: 1}
---
apiVersion: quotaplane.io/v1alpha1
kind: TenantQuota
metadata: {name: g2}
spec: {tenant: g2, tier: gold, weight: 2}
---
apiVersion: quotaplane.io/v1alpha1
kind: TenantQuota
metadata: {name: f1}
spec: {tenant: f1, tier: free, weight: 1}
---
apiVersion: quotaplane.io/v1alpha1
kind: TenantQuota
metadata: {name: f2}
spec: {tenant: f2, tier: free, weight: 2}
`

// orderTenants and their flow weights (tier weight × tenant weight), as
// orderPlane states them.
var orderFlowWeights = map[string]float64{"g1": 4, "g2": 8, "f1": 1, "f2": 2}

var orderCosts = map[string]int64{"read": 1, "write": 2, "export": 4}

// orderStep is one step of a scenario: a waiter arrives (Decide queues it),
// or the global bucket refills until the queue admits exactly one waiter.
type orderStep struct {
	admit    bool
	tenant   string
	endpoint string
}

func arrive(tenant, endpoint string) orderStep {
	return orderStep{tenant: tenant, endpoint: endpoint}
}

var admitOne = orderStep{admit: true}

// fifoDiscipline serves waiters in arrival order: the negative control.
type fifoDiscipline struct{ items []*waiter }

func (f *fifoDiscipline) Enqueue(_ uint64, _, _ float64, w *waiter) { f.items = append(f.items, w) }
func (f *fifoDiscipline) Dequeue() (uint64, *waiter, bool) {
	if len(f.items) == 0 {
		return 0, nil, false
	}
	w := f.items[0]
	f.items = f.items[1:]
	return 0, w, true
}
func (f *fifoDiscipline) Remove(match func(*waiter) bool) int {
	n := len(f.items)
	f.items = slices.DeleteFunc(f.items, match)
	return n - len(f.items)
}
func (f *fifoDiscipline) Len() int { return len(f.items) }

// contendOrder drives orderPlane into contention in virtual time up to 2s,
// each of the four tenants offering the global rate, so that every one of
// them is over its fair share (and, queued, leaves the global bucket's
// reserve to tenants within theirs); then newcomers take what is left of
// the global bucket.
func contendOrder(t *testing.T, e *Engine) {
	tenants := []string{"g1", "g2", "f1", "f2"}
	for i := range 8000 {
		mustDecide(t, e, at(time.Duration(i)*250*time.Microsecond), Request{Tenant: tenants[i%4], Endpoint: "read"})
	}
	for i := 0; e.PlaneStatusAt(at(2*time.Second)).Global.Remaining > 0; i++ {
		mustDecide(t, e, at(2*time.Second), Request{Tenant: sprintf("newcomer-%d", i), Endpoint: "read"})
		if i > 10000 {
			t.Fatal("the global bucket does not empty")
		}
	}
	if !e.PlaneStatusAt(at(2 * time.Second)).Contended {
		t.Fatal("the plane is not contended after offering 4x its global rate")
	}
}

// queueUnderTest is an engine on orderPlane, contended at 2s with its
// global bucket empty, whose queue the test dispatches by hand
// (dispatchReady), so that every admission happens at a known step. Its
// fairness tick runs every second of virtual time, so contention and the
// tenants' shares stay as they were at 2s while the test runs (it moves
// the clock by less than a second).
type queueUnderTest struct {
	t     *testing.T
	e     *Engine
	clock *fakeClock
	// answers receives each waiter's index and decision once its Decide
	// returns.
	answers  chan answer
	arrived  int
	admitted []int
}

func newQueueUnderTest(t *testing.T, mode string, fifo bool, opts ...Option) *queueUnderTest {
	t.Helper()
	clock := &fakeClock{}
	clock.Set(at(2 * time.Second))
	opts = append([]Option{WithClock(clock.Now), withQueueWait(time.Minute), withFairnessInterval(time.Second)}, opts...)
	e := newEngine(t, policytest.Compile(t, sprintf(orderPlane, mode)), opts...)
	contendOrder(t, e)
	q := &e.queue
	q.mu.Lock()
	q.started = true // no dispatcher goroutine: the test calls dispatchReady
	if fifo {
		q.wfq, q.drr = &fifoDiscipline{}, &fifoDiscipline{}
	}
	q.mu.Unlock()
	t.Cleanup(func() { // before Close, which would wait for the dispatcher
		q.mu.Lock()
		q.started = false
		q.mu.Unlock()
	})
	return &queueUnderTest{t: t, e: e, clock: clock, answers: make(chan answer, 1024)}
}

type answer struct {
	waiter   int
	decision Decision
}

// arrive queues one request and waits until it is in the queue, so that
// arrivals are queued in the scenario's order.
func (u *queueUnderTest) arrive(ctx context.Context, tenant, endpoint string) int {
	u.t.Helper()
	i := u.arrived
	u.arrived++
	live := u.e.queue.live.Load()
	go func() {
		d, err := u.e.Decide(ctx, Request{Tenant: tenant, Endpoint: endpoint})
		if err != nil && ctx.Err() == nil {
			u.t.Errorf("waiter %d: %v", i, err)
		}
		u.answers <- answer{i, d}
	}()
	poll.Until(u.t, 5*time.Second, "the request to queue", func() bool { return u.e.queue.live.Load() == live+1 })
	return i
}

func (u *queueUnderTest) held() int {
	q := &u.e.queue
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.heldLocked()
}

// admitOne refills the global bucket a token at a time, dispatching after
// each, until one waiter is answered; it returns the waiter's index. A
// waiter of cost c is admitted once the bucket holds c tokens above the
// reserve, and takes them: one step never admits two.
func (u *queueUnderTest) admitOne() (int, error) {
	for range 1000 {
		u.clock.Add(time.Millisecond) // one token at 1000/s
		before := u.e.queue.live.Load()
		u.e.dispatchReady()
		switch answered := before - u.e.queue.live.Load(); answered {
		case 0:
			continue
		case 1:
			select {
			case a := <-u.answers:
				if !a.decision.Allow {
					return a.waiter, fmt.Errorf("waiter %d answered %+v; want it admitted", a.waiter, a.decision)
				}
				u.admitted = append(u.admitted, a.waiter)
				return a.waiter, nil
			case <-time.After(5 * time.Second):
				return -1, fmt.Errorf("the answered waiter never returned")
			}
		default:
			return -1, fmt.Errorf("one token admitted %d waiters", answered)
		}
	}
	return -1, fmt.Errorf("no waiter admitted after 1 s of refill")
}

// run plays the scenario and returns the order in which the waiters (by
// arrival index) were admitted.
func (u *queueUnderTest) run(steps []orderStep) ([]int, error) {
	u.t.Helper()
	for _, s := range steps {
		if !s.admit {
			u.arrive(context.Background(), s.tenant, s.endpoint)
			continue
		}
		if _, err := u.admitOne(); err != nil {
			return u.admitted, err
		}
	}
	return u.admitted, nil
}

// oracleEntry is a waiter in an oracle.
type oracleEntry struct {
	index  int
	flow   string
	cost   float64
	finish float64 // wfq only
}

// wfqOracle is self-clocked fair queueing from its definition: a waiter's
// finish tag is max(V, its flow's last tag) + cost/weight, the smallest tag
// (earliest arrival on a tie) is served next, and V is the tag of the
// waiter last taken. It never forgets a flow.
type wfqOracle struct {
	queued     []oracleEntry
	lastFinish map[string]float64
	virtual    float64
}

func (o *wfqOracle) enqueue(e oracleEntry) {
	e.finish = max(o.virtual, o.lastFinish[e.flow]) + e.cost/orderFlowWeights[e.flow]
	o.lastFinish[e.flow] = e.finish
	o.queued = append(o.queued, e)
}

func (o *wfqOracle) dequeue() (oracleEntry, bool) {
	if len(o.queued) == 0 {
		return oracleEntry{}, false
	}
	best := 0
	for i, e := range o.queued {
		if e.finish < o.queued[best].finish { // strict: the earlier arrival keeps a tie
			best = i
		}
	}
	e := o.queued[best]
	o.queued = slices.Delete(o.queued, best, best+1)
	o.virtual = e.finish
	return e, true
}

// drrOracle is deficit round robin from its definition, looping through
// every round: flows take turns in the order they became backlogged; a turn
// adds quantum × weight to the flow's deficit and serves its waiters, oldest
// first, while the head's cost fits; a flow that empties leaves the
// rotation and its deficit is reset to 0.
type drrOracle struct {
	quantum float64
	flows   []string // the rotation; flows[0]'s turn
	queued  map[string][]oracleEntry
	deficit map[string]float64
	granted map[string]bool // flows[0]'s quantum of this turn is added
}

func (o *drrOracle) enqueue(e oracleEntry) {
	if len(o.queued[e.flow]) == 0 {
		o.flows = append(o.flows, e.flow)
	}
	o.queued[e.flow] = append(o.queued[e.flow], e)
}

func (o *drrOracle) dequeue() (oracleEntry, bool) {
	for len(o.flows) > 0 {
		f := o.flows[0]
		if !o.granted[f] {
			o.deficit[f] += o.quantum * orderFlowWeights[f]
			o.granted[f] = true
		}
		if head := o.queued[f][0]; head.cost <= o.deficit[f] {
			o.deficit[f] -= head.cost
			o.queued[f] = o.queued[f][1:]
			if len(o.queued[f]) == 0 {
				o.flows = o.flows[1:]
				o.deficit[f], o.granted[f] = 0, false
			}
			return head, true
		}
		o.granted[f] = false
		o.flows = append(o.flows[1:], f)
	}
	return oracleEntry{}, false
}

// oracleOrder plays steps through an oracle as the engine's dispatcher
// does: the waiter it takes is served next (not preemptively), and it takes
// the next one as soon as it admitted one.
func oracleOrder(mode string, steps []orderStep) []int {
	var enqueue func(oracleEntry)
	var dequeue func() (oracleEntry, bool)
	switch mode {
	case "wfq":
		o := &wfqOracle{lastFinish: map[string]float64{}}
		enqueue, dequeue = o.enqueue, o.dequeue
	case "drr":
		o := &drrOracle{quantum: 1, queued: map[string][]oracleEntry{}, deficit: map[string]float64{}, granted: map[string]bool{}}
		enqueue, dequeue = o.enqueue, o.dequeue
	}
	var order []int
	var taken *oracleEntry
	arrived := 0
	for _, s := range steps {
		if !s.admit {
			enqueue(oracleEntry{index: arrived, flow: s.tenant, cost: float64(orderCosts[s.endpoint])})
			arrived++
			continue
		}
		if taken == nil {
			if e, ok := dequeue(); ok {
				taken = &e
			}
		}
		order = append(order, taken.index)
		taken = nil
		if e, ok := dequeue(); ok {
			taken = &e
		}
	}
	return order
}

// checkOrder plays steps on an engine in mode (with a FIFO queue when fifo)
// and compares its admission order with the oracle's.
func checkOrder(t *testing.T, mode string, fifo bool, steps []orderStep) error {
	u := newQueueUnderTest(t, mode, fifo)
	got, err := u.run(steps)
	if err != nil {
		return err
	}
	if want := oracleOrder(mode, steps); !slices.Equal(got, want) {
		return fmt.Errorf("%s admitted the waiters in the order %v; %s's order is %v", mode, describe(steps, got), mode, describe(steps, want))
	}
	return nil
}

// describe names waiters by tenant, endpoint cost and arrival.
func describe(steps []orderStep, order []int) string {
	var arrivals []orderStep
	for _, s := range steps {
		if !s.admit {
			arrivals = append(arrivals, s)
		}
	}
	var b strings.Builder
	for i, w := range order {
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%s/%d#%d", arrivals[w].tenant, orderCosts[arrivals[w].endpoint], w)
	}
	return b.String()
}

// TestQueueOrderByHand pins the two disciplines on a case worked out by
// hand. f1 (flow weight 1) queues four reads (cost 1), then g2 (weight 8)
// two exports (cost 4) and f2 (weight 2) two writes (cost 2).
//
// wfq, tags max(V, last) + cost/weight with V = 0: f1 1, 2, 3, 4; g2 1/2,
// 1; f2 1, 2. Ties go to the earlier arrival: g2's first export (1/2), then
// at 1 f1's first read, g2's second export, f2's first write; at 2 f1's
// second read, f2's second write; f1's last two reads.
//
// drr, quantum 1 token × weight, turns in the order the flows arrived:
// f1's turn (deficit 1) serves a read; g2's (8) both exports; f2's (2) a
// write; f1's (1) a read; f2's (2) its second write; f1's last two reads.
//
// FIFO serves f1's four reads first and fails both.
func TestQueueOrderByHand(t *testing.T) {
	steps := []orderStep{
		arrive("f1", "read"), arrive("f1", "read"), arrive("f1", "read"), arrive("f1", "read"),
		arrive("g2", "export"), arrive("g2", "export"),
		arrive("f2", "write"), arrive("f2", "write"),
	}
	for range 8 {
		steps = append(steps, admitOne)
	}
	want := map[string][]int{
		"wfq": {4, 0, 5, 6, 1, 7, 2, 3},
		"drr": {0, 4, 5, 6, 1, 7, 2, 3},
	}
	for _, mode := range []string{"wfq", "drr"} {
		t.Run(mode, func(t *testing.T) {
			if got := oracleOrder(mode, steps); !slices.Equal(got, want[mode]) {
				t.Fatalf("the %s oracle gives %v; worked by hand: %v", mode, got, want[mode])
			}
			if err := checkOrder(t, mode, false, steps); err != nil {
				t.Fatal(err)
			}
			if err := checkOrder(t, mode, true, steps); err == nil {
				t.Fatal("a FIFO queue passed the order check: it cannot tell the discipline from arrival order")
			}
		})
	}
}

// TestQueueOrderRandom plays seeded random scenarios — arrivals of the
// four flows and three costs interleaved with admissions, so that virtual
// time moves and flows leave and rejoin — and checks each discipline's
// order against its oracle; a FIFO queue must fail at least one scenario
// of each.
func TestQueueOrderRandom(t *testing.T) {
	tenants := []string{"g1", "g2", "f1", "f2"}
	endpoints := []string{"read", "write", "export"}
	scenario := func(seed uint64) []orderStep {
		rng := rand.New(rand.NewPCG(seed, 13))
		var steps []orderStep
		queued := 0
		for range 6 {
			for range 1 + rng.IntN(6) {
				steps = append(steps, arrive(tenants[rng.IntN(len(tenants))], endpoints[rng.IntN(len(endpoints))]))
				queued++
			}
			for range rng.IntN(queued + 1) {
				steps = append(steps, admitOne)
				queued--
			}
		}
		for ; queued > 0; queued-- {
			steps = append(steps, admitOne)
		}
		return steps
	}
	const seeds = 6
	for _, mode := range []string{"wfq", "drr"} {
		t.Run(mode, func(t *testing.T) {
			fifoFailed := 0
			for seed := range uint64(seeds) {
				steps := scenario(seed)
				if err := checkOrder(t, mode, false, steps); err != nil {
					t.Fatalf("seed %d: %v", seed, err)
				}
				if checkOrder(t, mode, true, steps) != nil {
					fifoFailed++
				}
			}
			if fifoFailed == 0 {
				t.Fatalf("a FIFO queue passed all %d scenarios: they cannot tell %s from arrival order", seeds, mode)
			}
			t.Logf("FIFO failed %d of %d scenarios", fifoFailed, seeds)
		})
	}
}

// TestQueueAbandonedWaitersAreSwept: waiters whose callers gave up leave
// the queue in a sweep, so that they neither fill it (maxQueue bounds what
// the queue holds, abandoned waiters included) nor spend their flow's turn
// (drr's deficit).
func TestQueueAbandonedWaitersAreSwept(t *testing.T) {
	u := newQueueUnderTest(t, "drr", false, withMaxQueue(4))
	ctx, cancel := context.WithCancel(context.Background())
	for range 3 {
		u.arrive(ctx, "f2", "read") // waiters 0, 1, 2: abandoned below
	}
	write := u.arrive(context.Background(), "f2", "write") // 3
	cancel()
	for range 3 {
		<-u.answers
	}
	poll.Until(t, 5*time.Second, "the waiters to abandon", func() bool { return u.e.queue.live.Load() == 1 })

	// The queue holds four waiters, three of them abandoned: a newcomer
	// sweeps them out instead of finding the queue full.
	read := u.arrive(context.Background(), "f1", "read") // 4
	if held := u.held(); held != 2 {
		t.Fatalf("the queue holds %d waiters after the sweep; want the 2 live ones", held)
	}
	// f2 (weight 2) is first in the rotation: its turn's 2 tokens cover
	// its write. Unswept, its abandoned reads would have spent them, and
	// f1's read gone first.
	for _, want := range []int{write, read} {
		got, err := u.admitOne()
		if err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Fatalf("admitted waiter %d; want %d (order so far %v)", got, want, u.admitted)
		}
	}

	// A queue full of live waiters refuses a newcomer at once.
	u.arrive(context.Background(), "f1", "read")
	u.arrive(context.Background(), "f1", "read")
	u.arrive(context.Background(), "f1", "read")
	u.arrive(context.Background(), "f1", "read")
	d, err := u.e.Decide(context.Background(), Request{Tenant: "g1", Endpoint: "read"})
	if err != nil || d.Allow || d.Level != LevelGlobal {
		t.Fatalf("Decide with the queue full = %+v, %v; want the global denial at once", d, err)
	}
	if held := u.held(); held != 4 {
		t.Fatalf("the queue holds %d waiters; want maxQueue (4)", held)
	}
}
