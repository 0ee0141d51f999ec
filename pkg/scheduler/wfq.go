package scheduler

import "math"

// WFQ is a self-clocked weighted fair queue (Golestani's SCFQ): it hands out
// queued items in the order a bit-by-bit weighted round robin would finish
// them, using the finish tag of the item last dequeued as virtual time, so it
// needs no clock and no simulation of the fluid system.
//
// Each item gets the finish tag F = max(V, lastFinish[flow]) + cost/weight
// when it is enqueued, where V is the virtual time. Dequeue returns the item
// with the smallest tag, ties going to the earlier Enqueue. Per-flow state
// exists only while the flow has items queued, so memory is proportional to
// the number of queued items (plus the retained capacity of one slice).
//
// A WFQ is not safe for concurrent use; the caller serialises access.
type WFQ[T any] struct {
	heap        []wfqEntry[T]
	flows       map[uint64]wfqFlow
	virtualTime float64
	nextSeq     uint64
}

type wfqEntry[T any] struct {
	finish float64
	seq    uint64 // enqueue order: breaks finish-tag ties, making the order total and deterministic
	flow   uint64
	item   T
}

type wfqFlow struct {
	lastFinish float64 // finish tag of the flow's most recently enqueued item still in the queue
	queued     int
	touched    bool // scratch mark used only inside Remove
}

// NewWFQ returns an empty queue.
func NewWFQ[T any]() *WFQ[T] {
	return &WFQ[T]{flows: make(map[uint64]wfqFlow)}
}

// sanitizeCost repairs costs that would poison the ordering: NaN and
// negative costs become 0 (the item is free) and +Inf becomes the largest
// finite float (the item goes behind everything else in its flow).
func sanitizeCost(cost float64) float64 {
	if !(cost >= 0) {
		return 0
	}
	return min(cost, math.MaxFloat64)
}

// Enqueue queues item for flow. weight is the flow's share (> 0; repaired as
// documented on Item when it is not) and cost the service the item will
// consume (>= 0; NaN and negative costs count as 0, +Inf as the largest
// finite float). The weight applies to this item only, so a flow whose weight
// changes is charged at the new rate from its next item on.
func (q *WFQ[T]) Enqueue(flow uint64, weight float64, cost float64, item T) {
	weight = sanitizeWeight(weight)
	cost = sanitizeCost(cost)
	state := q.flows[flow] // absent flow: lastFinish 0 <= V, so it starts at V
	finish := max(q.virtualTime, state.lastFinish) + cost/weight
	state.lastFinish = finish
	state.queued++
	q.flows[flow] = state
	q.heap = append(q.heap, wfqEntry[T]{finish: finish, seq: q.nextSeq, flow: flow, item: item})
	q.nextSeq++
	q.siftUp(len(q.heap) - 1)
}

// Dequeue removes and returns the item with the smallest finish tag, ties
// going to the item enqueued first. ok is false when the queue is empty.
func (q *WFQ[T]) Dequeue() (flow uint64, item T, ok bool) {
	if len(q.heap) == 0 {
		return 0, item, false
	}
	top := q.heap[0]
	last := len(q.heap) - 1
	q.heap[0] = q.heap[last]
	q.heap[last] = wfqEntry[T]{} // do not keep the caller's item reachable
	q.heap = q.heap[:last]
	if last > 0 {
		q.siftDown(0)
	}

	// Tags leave the heap in nondecreasing order (every new tag is >= V and
	// V is the last tag that left), so this is the self-clock advancing.
	q.virtualTime = max(q.virtualTime, top.finish)

	state := q.flows[top.flow]
	state.queued--
	if state.queued == 0 {
		// The item just served was the flow's last, so lastFinish == V and
		// every later Enqueue would start at max(V, lastFinish) = V anyway:
		// forgetting the flow changes nothing.
		delete(q.flows, top.flow)
	} else {
		q.flows[top.flow] = state
	}
	q.resetClockIfIdle()
	return top.flow, top.item, true
}

// Len returns the number of queued items.
func (q *WFQ[T]) Len() int { return len(q.heap) }

// Remove deletes every queued item for which match returns true (cancelled
// waiters) and returns how many it deleted. match must not call back into q.
//
// Cancelled items consumed no service, so they must not push their flow's
// future items back: a flow's lastFinish drops to the largest tag it still
// has queued, and a flow left with nothing queued is forgotten. Items queued
// behind a cancelled one keep the tags they were given. Remove is O(n).
func (q *WFQ[T]) Remove(match func(T) bool) int {
	kept, removed := 0, 0
	for i := range q.heap {
		entry := q.heap[i]
		if !match(entry.item) {
			q.heap[kept] = entry
			kept++
			continue
		}
		state := q.flows[entry.flow]
		state.queued--
		state.lastFinish = q.virtualTime // every queued tag is >= V, so V is a safe starting point for the max below
		state.touched = true
		q.flows[entry.flow] = state
		removed++
	}
	if removed == 0 {
		return 0
	}
	clear(q.heap[kept:])
	q.heap = q.heap[:kept]

	for i := range q.heap {
		entry := &q.heap[i]
		state := q.flows[entry.flow]
		if state.touched && entry.finish > state.lastFinish {
			state.lastFinish = entry.finish
			q.flows[entry.flow] = state
		}
	}
	for id, state := range q.flows { // order-independent: each entry is handled on its own
		if !state.touched {
			continue
		}
		if state.queued == 0 {
			delete(q.flows, id)
			continue
		}
		state.touched = false
		q.flows[id] = state
	}

	for i := len(q.heap)/2 - 1; i >= 0; i-- {
		q.siftDown(i)
	}
	q.resetClockIfIdle()
	return removed
}

// resetClockIfIdle restarts virtual time at 0 when nothing is queued. No
// flow state survives an idle moment, so the restart is an unobservable
// translation of all future tags; it keeps V small so that cost/weight
// increments do not lose precision against an ever-growing clock.
func (q *WFQ[T]) resetClockIfIdle() {
	if len(q.heap) == 0 {
		q.virtualTime = 0
	}
}

func (q *WFQ[T]) less(i, j int) bool {
	a, b := &q.heap[i], &q.heap[j]
	if a.finish != b.finish {
		return a.finish < b.finish
	}
	return a.seq < b.seq
}

func (q *WFQ[T]) siftUp(i int) {
	for i > 0 {
		parent := (i - 1) / 2
		if !q.less(i, parent) {
			return
		}
		q.heap[i], q.heap[parent] = q.heap[parent], q.heap[i]
		i = parent
	}
}

func (q *WFQ[T]) siftDown(i int) {
	n := len(q.heap)
	for {
		smallest := i
		left, right := 2*i+1, 2*i+2
		if left < n && q.less(left, smallest) {
			smallest = left
		}
		if right < n && q.less(right, smallest) {
			smallest = right
		}
		if smallest == i {
			return
		}
		q.heap[i], q.heap[smallest] = q.heap[smallest], q.heap[i]
		i = smallest
	}
}
