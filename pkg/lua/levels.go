package lua

import (
	"context"
	"encoding/binary"

	"github.com/redis/go-redis/v9"

	"github.com/quotaplane/quotaplane/pkg/keyspace"
)

// Limit is a level's limit as the scripts take it.
type Limit struct {
	Algorithm, Rate, Burst, PeriodMicros int64
}

// LevelFields is the little-endian int64 that start every level's record
// (bucket.lua's Levels): algorithm, rate, burst, period µs, the index in
// KEYS of the key that holds the level, the offset and length of its field
// in the fields, and the next level that is a field of the same hash (the
// levels of one hash are a ring, so that the script reads them all with
// the first one it needs).
const LevelFields = 8

// Levels is the keys and levels of one script call in bucket.lua's form:
// each distinct key once, and per level its record (LevelFields int64,
// then the script's own) and its field. The zero value is empty; Reset
// empties it for reuse without giving its memory back.
type Levels struct {
	keys     []string
	keyIndex map[string]int64
	records  []byte
	fields   []byte
	n        int64
	// rings are, by key index, the first and the last level of each
	// hash's ring.
	rings map[int64][2]int64
}

// Reset empties l.
func (l *Levels) Reset() {
	clear(l.keyIndex)
	clear(l.rings)
	l.keys, l.records, l.fields, l.n = l.keys[:0], l.records[:0], l.fields[:0], 0
}

// Key returns key's index in the call's KEYS (from 1), adding it the first
// time.
func (l *Levels) Key(key string) int64 {
	if i, ok := l.keyIndex[key]; ok {
		return i
	}
	if l.keyIndex == nil {
		l.keyIndex = map[string]int64{}
	}
	l.keys = append(l.keys, key)
	i := int64(len(l.keys))
	l.keyIndex[key] = i
	return i
}

// Add appends a level whose state is at at, with its limit and the
// script's extra int64 (as many for every level of a call), and returns
// its index (from 1).
func (l *Levels) Add(at keyspace.Level, lim Limit, extra ...int64) int64 {
	key := l.Key(at.Key)
	l.n++
	var next int64
	if at.Field != "" {
		if l.rings == nil {
			l.rings = map[int64][2]int64{}
		}
		ring, ok := l.rings[key]
		if !ok {
			ring = [2]int64{l.n, l.n}
		}
		next = ring[0]
		if ok { // the last level so far now leads to this one
			width := len(l.records) / 8 / int(l.n-1)
			binary.LittleEndian.PutUint64(l.records[8*(width*int(ring[1]-1)+LevelFields-1):], uint64(l.n))
		}
		l.rings[key] = [2]int64{ring[0], l.n}
	}
	for _, v := range [LevelFields]int64{lim.Algorithm, lim.Rate, lim.Burst, lim.PeriodMicros, key, int64(len(l.fields)), int64(len(at.Field)), next} {
		l.records = binary.LittleEndian.AppendUint64(l.records, uint64(v))
	}
	for _, v := range extra {
		l.records = binary.LittleEndian.AppendUint64(l.records, uint64(v))
	}
	l.fields = append(l.fields, at.Field...)
	return l.n
}

// Len is the number of levels.
func (l *Levels) Len() int { return int(l.n) }

// Keys are the call's KEYS.
func (l *Levels) Keys() []string { return l.keys }

// DecideCall is a Decide call (decide.lua's header): the requests (records
// of DecideRequestFields int64) against levels, whose first two are the
// global bucket and the burst pool, with the demand counter as their third
// key; at now µs (0: Redis TIME); countDemand adds the batch's cost to the
// counter.
func DecideCall(levels *Levels, now int64, requests []byte, countDemand bool) Call {
	demand := 0
	if countDemand {
		demand = 1
	}
	return Call{Keys: levels.keys, Args: []any{now, levels.records, requests, demand, levels.fields}}
}

// PeekCall is a Peek call: levels (records of LevelFields) read at now µs
// (0: Redis TIME).
func PeekCall(levels *Levels, now int64) Call {
	return Call{Keys: levels.keys, Args: []any{now, levels.records, levels.fields}}
}

// RefundCall is a Refund call: levels whose records carry the tokens to
// give back (RefundRecordFields), after a Decide that decided at decided
// µs, refilled to now µs (0: Redis TIME).
func RefundCall(levels *Levels, now, decided int64) Call {
	return Call{Keys: levels.keys, Args: []any{now, decided, levels.records, levels.fields}}
}

// DebitCall is a Debit call: token buckets whose records carry the tokens
// to debit (DebitRecordFields), refilled to now µs (0: Redis TIME).
func DebitCall(levels *Levels, now int64) Call {
	return Call{Keys: levels.keys, Args: []any{now, levels.records, levels.fields}}
}

// RunCall runs one call of s (Run).
func (s *Script) RunCall(ctx context.Context, c redis.Scripter, call Call) *redis.Cmd {
	return s.Run(ctx, c, call.Keys, call.Args...)
}

// Records are the levels' records (a script's levels argument).
func (l *Levels) Records() []byte { return l.records }

// Fields are the levels' fields, concatenated (a script's fields argument).
func (l *Levels) Fields() []byte { return l.fields }
