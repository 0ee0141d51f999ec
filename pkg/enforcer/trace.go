package enforcer

import (
	"crypto/sha256"
	"encoding/hex"
	"math"
	"time"

	"github.com/quotaplane/quotaplane/pkg/policy"
)

// TraceLength is how many recent entries the engine keeps per tenant: a
// decision each, but a run of admitted decisions alike (same endpoint,
// key, cost and loan) is one entry with its count, so that a busy
// tenant's trace reaches back past its last few milliseconds and a
// decision writes the cache line it wrote last.
const TraceLength = 16

// TraceEntry is one decision in a tenant's trace, or Count admitted ones
// alike in a row, the last at At.
type TraceEntry struct {
	At       time.Time
	Count    int64
	Endpoint string
	// KeyHash is the request's api key as policy.ShortKeyHash shows it (12
	// hex digits of its SHA-256); empty for a request without a key. The
	// trace never holds the key.
	KeyHash  string
	Cost     int64
	Borrowed int64
	Allow    bool
	Level    Level
	Reason   string
}

// traceRing keeps the last TraceLength entries. An entry is 64 bytes:
// times in µs, the level as an index, the key's short hash as bytes, and
// strings shared with the policy, never built.
//
// The newest entry's run (its count and last time) and what an admitted
// decision compares to join it are kept in the ring's first 64 bytes, not
// in the entry, until a decision unlike it comes: a run of admitted
// decisions then writes one cache line, where one in the entries would
// read the ring's head and write the entry, two lines a tenant that
// other tenants' decisions keep evicting
// (BenchmarkDecideAtUncontended).
type traceRing struct {
	runAtUs  int64
	runCount int32
	next, n  uint8
	// The newest entry's fields a run compares, as recorded.
	lastCost              int64
	lastEndpoint          *policy.Endpoint
	lastBorrowed          int32
	lastAllow, lastHasKey bool
	// hashedKey is the api key whose short hash is keyHash: the trace
	// stores a key's hash, never the key, and most of a tenant's traffic
	// comes through few keys, so it is computed once per change of key.
	hashedKey string
	keyHash   [shortKeyHashBytes]byte
	entries   [TraceLength]traceEntry
}

type traceEntry struct {
	atUs     int64
	cost     int64
	reason   string
	endpoint *policy.Endpoint // nil for an endpoint the plane does not name
	borrowed int32            // at most a pool's size, below 2^31
	level    int8             // index in Levels, -1 when allowed
	allow    bool
	hasKey   bool
	keyHash  [shortKeyHashBytes]byte
	count    int32 // decisions alike in a row, admitted ones only (the newest entry's in the ring's run)
}

// shortKeyHashBytes is the bytes of policy.ShortKeyHash's 12 hex digits.
const shortKeyHashBytes = 6

// shortKeyHash is policy.ShortKeyHash(key) as bytes, without allocating.
func shortKeyHash(key string) (h [shortKeyHashBytes]byte) {
	var buf [policy.MaxNameBytes]byte // a valid key fits: hashing from the stack
	var sum [sha256.Size]byte
	if len(key) <= len(buf) {
		sum = sha256.Sum256(buf[:copy(buf[:], key)])
	} else {
		sum = sha256.Sum256([]byte(key))
	}
	copy(h[:], sum[:])
	return h
}

// push makes room for the newest entry and returns it to be written,
// writing the run of the one before into it.
func (r *traceRing) push() *traceEntry {
	if r.n > 0 {
		last := &r.entries[(r.next+TraceLength-1)%TraceLength]
		last.atUs, last.count = r.runAtUs, r.runCount
	}
	e := &r.entries[r.next]
	r.next = (r.next + 1) % TraceLength
	r.n = min(r.n+1, TraceLength)
	return e
}

// record writes decision d, made at now, as the newest entry, with the
// short hash of its api key when it has one.
func (r *traceRing) record(now int64, d *Decision, apiKey string, endpoint *policy.Endpoint) {
	hasKey := apiKey != ""
	// The newest entry's key, when it had one, is hashedKey.
	sameKey := !hasKey || apiKey == r.hashedKey
	if !sameKey {
		r.hashedKey, r.keyHash = apiKey, shortKeyHash(apiKey)
	}
	if r.n > 0 && d.Allow && r.lastAllow && r.lastCost == d.Cost && r.lastBorrowed == int32(d.Borrowed) &&
		r.lastEndpoint == endpoint && r.lastHasKey == hasKey && sameKey && r.runCount < math.MaxInt32 {
		r.runAtUs = now
		r.runCount++
		return
	}
	// Written in place, field by field: a struct literal would be built
	// aside and copied with write barriers.
	entry := r.push()
	entry.cost, entry.borrowed, entry.allow = d.Cost, int32(d.Borrowed), d.Allow
	entry.reason = d.Reason
	entry.level = int8(d.Level.index())
	entry.endpoint = endpoint
	entry.hasKey, entry.keyHash = hasKey, r.keyHash
	r.runAtUs, r.runCount = now, 1
	r.lastCost, r.lastBorrowed, r.lastAllow, r.lastEndpoint, r.lastHasKey = d.Cost, int32(d.Borrowed), d.Allow, endpoint, hasKey
}

// newestFirst copies the trace out, most recent decision first; nil for
// no trace.
func (r *traceRing) newestFirst() []TraceEntry {
	if r == nil {
		return nil
	}
	out := make([]TraceEntry, r.n)
	for i := range int(r.n) {
		e := r.entries[(int(r.next)-1-i+2*TraceLength)%TraceLength]
		if i == 0 {
			e.atUs, e.count = r.runAtUs, r.runCount
		}
		out[i] = TraceEntry{
			At: time.UnixMicro(e.atUs), Count: int64(e.count),
			Cost: e.cost, Borrowed: int64(e.borrowed), Allow: e.allow, Reason: e.reason,
		}
		if e.hasKey {
			out[i].KeyHash = hex.EncodeToString(e.keyHash[:])
		}
		if e.endpoint != nil {
			out[i].Endpoint = e.endpoint.Name
		}
		if e.level >= 0 {
			out[i].Level = Levels[e.level]
		}
	}
	return out
}
