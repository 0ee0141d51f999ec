package enforcer

import (
	"time"
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

// traceRing keeps the last TraceLength decisions. Entries hold µs, not a
// time.Time, to keep the ring small; strings are shared, never built.
type traceRing struct {
	entries [TraceLength]traceEntry
	next    int
	n       int
}

type traceEntry struct {
	atUs     int64
	endpoint string
	apiKey   string
	cost     int64
	borrowed int64
	allow    bool
	level    Level
	reason   string
}

func (r *traceRing) add(e traceEntry) {
	r.entries[r.next] = e
	r.next = (r.next + 1) % TraceLength
	if r.n < TraceLength {
		r.n++
	}
}

// newestFirst copies the trace out, most recent decision first.
func (r *traceRing) newestFirst() []TraceEntry {
	out := make([]TraceEntry, r.n)
	for i := range r.n {
		e := r.entries[(r.next-1-i+2*TraceLength)%TraceLength]
		out[i] = TraceEntry{
			At: time.UnixMicro(e.atUs), Endpoint: e.endpoint, APIKey: e.apiKey,
			Cost: e.cost, Borrowed: e.borrowed, Allow: e.allow, Level: e.level, Reason: e.reason,
		}
	}
	return out
}
