package enforcer

import (
	"context"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quotaplane/quotaplane/pkg/scheduler"
)

// In the queueing modes (fairness wfq and drr) a request that Decide finds
// denied at the global level while the plane is contended does not get its
// 429 at once: it waits, up to the queue wait (withQueueWait), for global
// capacity, and waiting requests are served in the order of the mode's
// discipline — weighted fair queueing by virtual finish tag, or deficit round
// robin — with the flow weight the allocation shares by (flowWeight). A
// dispatcher
// goroutine admits the next waiter whenever the global bucket can cover it,
// re-checking every level, so a queued request is decided exactly as a new
// one would be except for the fair-share pacing the queue replaces. A
// request that times out, or whose context ends, gets its original denial.
// DecideAt never waits: it is the fluid form, where every fair mode paces
// each tenant at its weighted max-min share.
//
// The order is the discipline's own (pkg/scheduler, one implementation of
// each): with wfq a waiter of cost c and flow weight w gets the finish tag
// F = max(V, the flow's last finish tag) + c/w, V being the tag of the
// waiter last taken (self-clocked), and the smallest tag goes first; with
// drr the flows with waiters take turns, each turn adding the flow's
// quantum (w tokens) to its deficit and admitting its waiters, oldest
// first, while their cost fits. Service is not preemptive: the waiter the
// dispatcher has taken is the next admitted, however long the global level
// takes to cover it, and a later arrival does not overtake it.
//
// A waiter whose caller gave up (its queue wait is over, its context ended)
// is never admitted: the dispatcher skips it. It stays in the discipline
// until then, or until a sweep removes the abandoned waiters — once an
// eighth of the queue has been abandoned, or the queue is full — so that
// the queue never holds more than maxQueue waiters, abandoned ones
// included, and a sweep costs O(1) per abandoned waiter. A swept waiter consumed no
// service: DRR's deficit is not spent on it, and WFQ's waiters enqueued
// after the sweep are not tagged behind it (those enqueued before keep the
// tags they were given: pkg/scheduler's Remove).

// maxDispatchSleep bounds how long the dispatcher sleeps while a waiter is
// pending.
const maxDispatchSleep = 10 * time.Millisecond

// discipline is what the queue needs of scheduler.WFQ and scheduler.DRR.
type discipline interface {
	Enqueue(flow uint64, weight, cost float64, item *waiter)
	Dequeue() (flow uint64, item *waiter, ok bool)
	Remove(match func(*waiter) bool) int
	Len() int
}

// waiter is one queued request. state moves from waiting to taken (by the
// dispatcher) or to abandoned (by the caller), exactly once each way, so a
// request is never both admitted and reported denied.
type waiter struct {
	req      Request
	denial   Decision // what the caller gets if it is never admitted
	deadline time.Time
	ctx      context.Context
	state    atomic.Int32
	answer   chan Decision // buffered: the dispatcher never blocks on it
}

// expired reports whether the waiter's caller no longer waits for an
// admission: its queue wait is over or its context ended.
func (w *waiter) expired() bool {
	return w.ctx.Err() != nil || !time.Now().Before(w.deadline)
}

const (
	waiting int32 = iota
	taken
	abandoned
)

// queue holds the waiters. mu guards everything but wake and the atomics.
type queue struct {
	mu       sync.Mutex
	wfq      discipline
	drr      discipline
	pending  *waiter // dequeued, but the global bucket could not cover it yet
	started  bool
	seed     maphash.Seed
	wake     chan struct{}
	stop     chan struct{}
	done     chan struct{}
	maxQueue int
	live     atomic.Int64 // waiters not yet answered or abandoned
	// abandonedSince counts the waiters whose callers gave up since the
	// disciplines were last swept of them (removeAbandonedLocked).
	abandonedSince atomic.Int64
}

func (q *queue) init(maxQueue int) {
	q.wfq = scheduler.NewWFQ[*waiter]()
	q.drr = scheduler.NewDRR[*waiter](1)
	q.seed = maphash.MakeSeed()
	q.wake = make(chan struct{}, 1)
	q.stop = make(chan struct{})
	q.done = make(chan struct{})
	q.maxQueue = maxQueue
}

func (q *queue) discipline(mode fairnessMode) discipline {
	if mode == fairDRR {
		return q.drr
	}
	return q.wfq
}

func (q *queue) otherDiscipline(mode fairnessMode) discipline {
	if mode == fairDRR {
		return q.wfq
	}
	return q.drr
}

// wait queues r after its global denial d and waits for the dispatcher, the
// queue wait or ctx, whichever comes first.
func (e *Engine) wait(ctx context.Context, snap *snapshot, r Request, d Decision) (Decision, error) {
	q := &e.queue
	w := &waiter{req: r, denial: d, deadline: time.Now().Add(e.settings.queueWait), ctx: ctx, answer: make(chan Decision, 1)}
	q.mu.Lock()
	q.sweepAbandonedLocked(q.heldLocked() >= q.maxQueue)
	if q.heldLocked() >= q.maxQueue {
		q.mu.Unlock()
		return d, nil // the queue is full: no wait, the 429 now
	}
	q.live.Add(1)
	q.discipline(snap.fairness).Enqueue(maphash.String(q.seed, r.Tenant), flowWeight(snap, r), float64(d.Cost), w)
	if !q.started {
		q.started = true
		go e.dispatch()
	}
	q.mu.Unlock()
	q.poke()

	timer := time.NewTimer(e.settings.queueWait)
	defer timer.Stop()
	select {
	case got := <-w.answer:
		// The dispatcher answers a waiter whose context ended with its
		// denial: the caller gets its context error, as when it gave up
		// first (the select picks either when both are ready).
		if err := ctx.Err(); err != nil && !got.Allow {
			return Decision{}, err
		}
		return got, nil
	case <-timer.C:
	case <-ctx.Done():
	}
	if w.state.CompareAndSwap(waiting, abandoned) {
		q.live.Add(-1)
		q.abandonedSince.Add(1) // after the swap: a sweep that misses it sees the count
		if err := ctx.Err(); err != nil {
			return Decision{}, err
		}
		return d, nil
	}
	// The dispatcher has it; it answers at once, with the denial if it
	// cannot admit it, since the waiter has expired.
	got := <-w.answer
	if err := ctx.Err(); err != nil && !got.Allow {
		return Decision{}, err // as when the caller gave up first
	}
	return got, nil
}

// flowWeight is a waiter's weight in the discipline, the weight the
// plane's allocation shares by: shareBy tenant, the tenant's own (its
// tier's for a tenant the policy does not name); shareBy tier, its tier's
// weight times its own (a tenant the policy does not name has weight 1 in
// its tier).
func flowWeight(snap *snapshot, r Request) float64 {
	rec, known := snap.recordOf(r.Tenant, r.Tier)
	if snap.shareByTenant {
		return float64(max(rec.tenant.Weight, 1))
	}
	weight := int64(1)
	if known {
		weight = rec.tenant.Weight
	}
	return float64(snap.tierWeights[rec.tierRank] * weight)
}

// heldLocked is the number of waiters the queue holds, abandoned ones not
// yet swept included: what maxQueue bounds.
func (q *queue) heldLocked() int {
	n := q.wfq.Len() + q.drr.Len()
	if q.pending != nil {
		n++
	}
	return n
}

// sweepAbandonedLocked sweeps the abandoned waiters out of both disciplines
// once the abandonments since the last sweep are at least an eighth of what
// the queue holds (or force, when the queue is full and any happened): a
// sweep is O(held) and follows at least held/8 abandonments, so sweeping
// costs O(1) per abandoned waiter.
func (q *queue) sweepAbandonedLocked(force bool) {
	n := q.abandonedSince.Load()
	if n == 0 || !force && 8*n < int64(q.heldLocked()) {
		return
	}
	q.abandonedSince.Add(-n) // abandonments racing the sweep are counted for the next
	isAbandoned := func(w *waiter) bool { return w.state.Load() == abandoned }
	q.wfq.Remove(isAbandoned)
	q.drr.Remove(isAbandoned)
}

func (q *queue) poke() {
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// dispatch admits waiters in the discipline's order while the global bucket
// covers them, then sleeps until it may again.
func (e *Engine) dispatch() {
	q := &e.queue
	defer close(q.done)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		sleep := e.dispatchReady()
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		timer.Reset(sleep)
		select {
		case <-q.stop:
			e.drainQueue()
			return
		case <-q.wake:
		case <-timer.C:
		}
	}
}

// dispatchReady admits what it can and returns how long to sleep.
func (e *Engine) dispatchReady() time.Duration {
	q := &e.queue
	for {
		q.mu.Lock()
		w := q.pending
		q.pending = nil
		if w == nil {
			q.sweepAbandonedLocked(false)
			// The current discipline first, then the other: waiters queued
			// before the policy switched between wfq and drr are served too.
			current := e.snap.Load().fairness
			if _, w, _ = q.discipline(current).Dequeue(); w == nil {
				_, w, _ = q.otherDiscipline(current).Dequeue()
			}
		}
		q.mu.Unlock()
		if w == nil {
			return time.Hour
		}
		if !w.state.CompareAndSwap(waiting, taken) {
			continue // its caller gave up
		}
		var d Decision
		err := e.decideOpts(e.clock(), &w.req, fromQueue, &d)
		if err == nil && !d.Allow && d.Level == LevelGlobal && !w.expired() {
			w.state.Store(waiting)
			q.mu.Lock()
			q.pending = w
			q.mu.Unlock()
			// Poll at least every maxDispatchSleep: the clock may be
			// virtual, and other decisions move the bucket too.
			return min(max(d.RetryAfter, e.settings.clockPrecision), maxDispatchSleep)
		}
		if err != nil || (!d.Allow && d.Level == LevelGlobal) {
			d = w.denial // expired, or the policy changed under it
		}
		q.live.Add(-1)
		w.answer <- d
	}
}

// drainQueue answers every waiter with its denial at Close.
func (e *Engine) drainQueue() {
	q := &e.queue
	q.mu.Lock()
	defer q.mu.Unlock()
	answer := func(w *waiter) {
		if w != nil && w.state.CompareAndSwap(waiting, taken) {
			q.live.Add(-1)
			w.answer <- w.denial
		}
	}
	answer(q.pending)
	q.pending = nil
	for _, disc := range []discipline{q.wfq, q.drr} {
		for {
			_, w, ok := disc.Dequeue()
			if !ok {
				break
			}
			answer(w)
		}
	}
}
