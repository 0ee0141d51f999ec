package lua

import (
	"context"
	"encoding/binary"

	"github.com/redis/go-redis/v9"
)

// Limit is a level's limit as the scripts take it.
type Limit struct {
	Algorithm, Rate, Burst, PeriodMicros int64
}

// LevelFields is the little-endian int64 that start every level's record
// (bucket.lua's Levels): algorithm, rate, burst, period µs.
const LevelFields = 4

// Levels is the keys of one script call and a record per key, in
// bucket.lua's form: LevelFields int64, then the script's own. The zero
// value is empty; Reset empties it for reuse without giving its memory
// back.
type Levels struct {
	keys    []string
	records []byte
}

// Reset empties l.
func (l *Levels) Reset() {
	l.keys, l.records = l.keys[:0], l.records[:0]
}

// Add appends key with its limit and the script's extra int64 (as many for
// every key of a call), and returns its index in KEYS (from 1).
func (l *Levels) Add(key string, lim Limit, extra ...int64) int64 {
	l.keys = append(l.keys, key)
	for _, v := range [LevelFields]int64{lim.Algorithm, lim.Rate, lim.Burst, lim.PeriodMicros} {
		l.records = binary.LittleEndian.AppendUint64(l.records, uint64(v))
	}
	for _, v := range extra {
		l.records = binary.LittleEndian.AppendUint64(l.records, uint64(v))
	}
	return int64(len(l.keys))
}

// Len is the number of keys.
func (l *Levels) Len() int { return len(l.keys) }

// Keys are the call's KEYS.
func (l *Levels) Keys() []string { return l.keys }

// Records are the keys' records.
func (l *Levels) Records() []byte { return l.records }

// DecideCall is a Decide call (decide.lua's header): the requests (records
// of DecideRequestFields int64) against levels, whose first three keys are
// the global bucket, the burst pool and the demand counter; at now µs (0:
// Redis TIME); countDemand adds the batch's cost to the counter.
func DecideCall(levels *Levels, now int64, requests []byte, countDemand bool) Call {
	demand := 0
	if countDemand {
		demand = 1
	}
	return Call{Keys: levels.keys, Args: []any{now, levels.records, requests, demand}}
}

// PeekCall is a Peek call: levels read at now µs (0: Redis TIME).
func PeekCall(levels *Levels, now int64) Call {
	return Call{Keys: levels.keys, Args: []any{levels.records, now}}
}

// RefundCall is a Refund call: levels whose records carry the tokens to
// give back (RefundRecordFields), after a Decide that decided at decided
// µs, refilled to now µs (0: Redis TIME).
func RefundCall(levels *Levels, now, decided int64) Call {
	return Call{Keys: levels.keys, Args: []any{now, decided, levels.records}}
}

// DebitCall is a Debit call: token buckets whose records carry the tokens
// to debit (DebitRecordFields), refilled to now µs (0: Redis TIME).
func DebitCall(levels *Levels, now int64) Call {
	return Call{Keys: levels.keys, Args: []any{now, levels.records}}
}

// RunCall runs one call of s (Run).
func (s *Script) RunCall(ctx context.Context, c redis.Scripter, call Call) *redis.Cmd {
	return s.Run(ctx, c, call.Keys, call.Args...)
}
