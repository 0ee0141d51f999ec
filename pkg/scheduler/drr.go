package scheduler

import "math"

// DRR is Shreedhar and Varghese's deficit round robin. Flows with queued
// items take turns in a fixed cyclic order; at the start of its turn a flow's
// deficit grows by quantum·weight, and the flow is served while its head
// item's cost fits in the deficit. A flow whose queue empties leaves the
// rotation with its deficit reset to 0, so idle flows cannot bank credit.
//
// Compared with WFQ it needs no sorting (O(1) per item when quantum·weight is
// at least the largest cost) at the price of a looser fairness bound.
//
// A DRR is not safe for concurrent use; the caller serialises access.
type DRR[T any] struct {
	quantum float64
	flows   map[uint64]int // flow id -> index in slots, only for flows with queued items
	slots   []drrFlow[T]   // recycled through free so that flows that come and go do not allocate
	free    []int
	active  ring[int] // rotation order; the front is the flow whose turn it is
	queued  int
}

type drrFlow[T any] struct {
	id      uint64
	weight  float64
	deficit float64
	// granted reports that this turn's quantum has already been added. It
	// lets one turn span several Dequeue calls, and lets skipIdleRounds hand
	// out a round's quanta ahead of the visits.
	granted bool
	items   ring[drrEntry[T]]
}

type drrEntry[T any] struct {
	cost float64
	item T
}

// retainedQueueCap bounds the buffer a recycled flow slot keeps: small
// buffers are reused so steady state does not allocate, a burst's buffer is
// dropped so it does not stay pinned after the burst.
const retainedQueueCap = 64

// NewDRR returns an empty queue. quantum is the credit per unit of weight a
// flow receives each round, so a flow's quantum is quantum·weight. Choosing it
// at least as large as the largest cost keeps Dequeue O(1); smaller values
// are correct but cost O(active flows) per Dequeue when a whole round passes
// without anyone affording their head item. A quantum that is NaN or <= 0 is
// a caller bug and is repaired to minWeight (1e-9); +Inf to the largest finite
// float.
func NewDRR[T any](quantum float64) *DRR[T] {
	switch {
	case quantum > math.MaxFloat64:
		quantum = math.MaxFloat64
	case !(quantum > 0):
		quantum = minWeight
	}
	return &DRR[T]{quantum: quantum, flows: make(map[uint64]int)}
}

// Enqueue appends item to flow's FIFO; a flow that had nothing queued joins
// the end of the rotation with a zero deficit. weight and cost are repaired
// as for WFQ. The most recent weight is the one used for the flow's next turn.
func (q *DRR[T]) Enqueue(flow uint64, weight float64, cost float64, item T) {
	weight = sanitizeWeight(weight)
	cost = sanitizeCost(cost)
	index, ok := q.flows[flow]
	if !ok {
		index = q.acquire(flow)
		q.flows[flow] = index
		q.active.push(index)
	}
	state := &q.slots[index]
	state.weight = weight
	state.items.push(drrEntry[T]{cost: cost, item: item})
	q.queued++
}

// Dequeue returns the next item in deficit-round-robin order. ok is false
// when the queue is empty. It always makes progress: if a whole round passes
// in which no flow can afford its head item, the rounds that would pass
// without service are granted at once instead of being looped through.
func (q *DRR[T]) Dequeue() (flow uint64, item T, ok bool) {
	failedVisits := 0
	for q.active.len() > 0 {
		index := *q.active.front()
		state := &q.slots[index]
		if !state.granted {
			state.deficit += q.quantum * state.weight
			state.granted = true
		}
		if head := state.items.front(); head.cost <= state.deficit {
			entry := state.items.pop()
			state.deficit -= entry.cost
			q.queued--
			flow = state.id
			if state.items.len() == 0 {
				q.active.pop()
				q.release(index)
			}
			return flow, entry.item, true
		}
		// Turn over: the head does not fit. Keep the deficit for next round.
		state.granted = false
		q.active.pop()
		q.active.push(index)
		failedVisits++
		if failedVisits == q.active.len() {
			q.skipIdleRounds()
			failedVisits = 0
		}
	}
	return 0, item, false
}

// skipIdleRounds is called after every active flow has just been visited
// without being able to send. It computes k, the number of further rounds
// until the first flow can afford its head, and grants all k quanta to every
// flow now, marking round k's quantum as already granted. The next visits
// then behave exactly as the k-th round would: the same flows send in the
// same order with the same deficits. Without this, a cost far above the
// quantum would cost cost/quantum laps of the rotation per item. (The one
// observable difference: round k's quantum is computed with the weights at
// the time of the skip, so a weight changed by an Enqueue before the flow's
// round-k visit applies from its next turn instead.)
func (q *DRR[T]) skipIdleRounds() {
	rounds := math.Inf(1)
	for i := 0; i < q.active.len(); i++ {
		state := &q.slots[*q.active.at(i)]
		shortfall := state.items.front().cost - state.deficit
		rounds = min(rounds, math.Ceil(shortfall/(q.quantum*state.weight)))
	}
	for i := 0; i < q.active.len(); i++ {
		state := &q.slots[*q.active.at(i)]
		share := q.quantum * state.weight
		head := state.items.front().cost
		if math.Ceil((head-state.deficit)/share) > rounds {
			state.deficit += rounds * share // rounds is finite here: another flow needs fewer
			state.granted = true
			continue
		}
		// This flow can send in round k. Make sure the numbers say so even
		// when they cannot be trusted: rounding in k·share, a share that
		// underflowed to 0 (k = +Inf, k·share = NaN) or an overflow to +Inf
		// would otherwise leave the rotation without a sender, or let one
		// flow drain its whole queue on an infinite deficit.
		deficit := state.deficit + rounds*share
		if !(deficit >= head) || math.IsInf(deficit, 1) {
			deficit = head
		}
		state.deficit = deficit
		state.granted = true
	}
}

// Len returns the number of queued items.
func (q *DRR[T]) Len() int { return q.queued }

// Remove deletes every queued item for which match returns true (cancelled
// waiters), preserving the order of the rest, and returns how many it
// deleted. A flow left with nothing queued leaves the rotation and is
// forgotten, exactly as if it had been served to empty. match must not call
// back into q. Remove is O(n).
func (q *DRR[T]) Remove(match func(T) bool) int {
	removed, kept := 0, 0
	for i := 0; i < q.active.len(); i++ {
		index := *q.active.at(i)
		state := &q.slots[index]
		removed += removeMatching(&state.items, match)
		if state.items.len() == 0 {
			q.release(index)
			continue
		}
		*q.active.at(kept) = index
		kept++
	}
	q.active.truncate(kept)
	q.queued -= removed
	return removed
}

func removeMatching[T any](items *ring[drrEntry[T]], match func(T) bool) int {
	kept := 0
	for i := 0; i < items.len(); i++ {
		entry := items.at(i)
		if match(entry.item) {
			continue
		}
		*items.at(kept) = *entry
		kept++
	}
	removed := items.len() - kept
	items.truncate(kept)
	return removed
}

func (q *DRR[T]) acquire(flow uint64) int {
	var index int
	if n := len(q.free); n > 0 {
		index = q.free[n-1]
		q.free = q.free[:n-1]
	} else {
		index = len(q.slots)
		q.slots = append(q.slots, drrFlow[T]{})
	}
	q.slots[index].id = flow
	return index
}

// release forgets a flow whose queue is empty: the deficit resets to 0 (the
// DRR rule that stops idle flows from saving credit) and the slot is recycled.
func (q *DRR[T]) release(index int) {
	state := &q.slots[index]
	delete(q.flows, state.id)
	items := state.items
	if cap(items.buf) > retainedQueueCap {
		items = ring[drrEntry[T]]{}
	}
	*state = drrFlow[T]{items: items}
	q.free = append(q.free, index)
}

// ring is a FIFO on a circular buffer that grows by doubling and never
// shrinks, so a queue that stays within its high-water mark never allocates.
type ring[E any] struct {
	buf  []E
	head int
	n    int
}

func (r *ring[E]) len() int { return r.n }

// at returns the i-th element from the front; i must be < len().
func (r *ring[E]) at(i int) *E {
	i += r.head
	if i >= len(r.buf) {
		i -= len(r.buf)
	}
	return &r.buf[i]
}

func (r *ring[E]) front() *E { return &r.buf[r.head] }

func (r *ring[E]) push(e E) {
	if r.n == len(r.buf) {
		r.grow()
	}
	*r.at(r.n) = e
	r.n++
}

func (r *ring[E]) pop() E {
	var zero E
	e := r.buf[r.head]
	r.buf[r.head] = zero // do not keep the caller's item reachable
	r.head++
	if r.head == len(r.buf) {
		r.head = 0
	}
	r.n--
	if r.n == 0 {
		r.head = 0
	}
	return e
}

// truncate keeps the first n elements and clears the rest.
func (r *ring[E]) truncate(n int) {
	var zero E
	for i := n; i < r.n; i++ {
		*r.at(i) = zero
	}
	r.n = n
	if n == 0 {
		r.head = 0
	}
}

func (r *ring[E]) grow() {
	grown := make([]E, max(4, 2*len(r.buf)))
	for i := 0; i < r.n; i++ {
		grown[i] = *r.at(i)
	}
	r.buf = grown
	r.head = 0
}
