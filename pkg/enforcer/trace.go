package enforcer

import (
	"time"

	"github.com/quotaplane/quotaplane/pkg/policy"
)

// TraceLength is how many recent decisions the engine keeps per tenant.
const TraceLength = 16

// TraceEntry is one decision in a tenant's trace.
type TraceEntry struct {
	At       time.Time
	Endpoint string
	APIKey   string
	Cost     int64
	Borrowed int64
	Allow    bool
	Level    Level
	Reason   string
}

// traceRing keeps the last TraceLength decisions. An entry is one cache
// line: times in µs, the level as an index, and strings shared with the
// policy or the request, never built.
type traceRing struct {
	entries [TraceLength]traceEntry
	next    int
	n       int
}

type traceEntry struct {
	atUs     int64
	cost     int64
	apiKey   string
	reason   string
	endpoint *policy.Endpoint // nil for an endpoint the plane does not name
	borrowed int32            // at most a pool's size, below 2^31
	level    int8             // index in Levels, -1 when allowed
	allow    bool
}

// push makes room for the newest entry and returns it to be written.
func (r *traceRing) push() *traceEntry {
	e := &r.entries[r.next]
	r.next = (r.next + 1) % TraceLength
	r.n = min(r.n+1, TraceLength)
	return e
}

// record writes decision d, made at now, as the newest entry.
func (r *traceRing) record(now int64, d *Decision, apiKey string, endpoint *policy.Endpoint) {
	// Written in place, field by field: an entry is a cache line, and a
	// struct literal would be built aside and copied with write barriers.
	entry := r.push()
	entry.atUs, entry.cost, entry.borrowed, entry.allow = now, d.Cost, int32(d.Borrowed), d.Allow
	entry.apiKey, entry.reason = apiKey, d.Reason
	entry.level = int8(d.Level.index())
	entry.endpoint = endpoint
}

// newestFirst copies the trace out, most recent decision first.
func (r *traceRing) newestFirst() []TraceEntry {
	out := make([]TraceEntry, r.n)
	for i := range r.n {
		e := r.entries[(r.next-1-i+2*TraceLength)%TraceLength]
		out[i] = TraceEntry{
			At: time.UnixMicro(e.atUs), APIKey: e.apiKey,
			Cost: e.cost, Borrowed: int64(e.borrowed), Allow: e.allow, Reason: e.reason,
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
