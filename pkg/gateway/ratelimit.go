package gateway

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/quotaplane/quotaplane/pkg/enforcer"
	"github.com/quotaplane/quotaplane/pkg/policy"
	"github.com/quotaplane/quotaplane/pkg/quotaheaders"
)

// Bounds on a RateLimitRequest.
const (
	// MaxDescriptors is the most descriptors one request may carry: the
	// engine decides at most enforcer.MaxGroup requests all-or-nothing.
	MaxDescriptors = enforcer.MaxGroup
	// MaxEntries is the most entries one descriptor may carry.
	MaxEntries = 16
)

// rateLimitService is envoy.service.ratelimit.v3.RateLimitService.
type rateLimitService struct {
	rlsv3.UnimplementedRateLimitServiceServer
	engine  func() (*enforcer.Engine, error)
	observe Observer
}

// ShouldRateLimit decides all of req's descriptors together: see the
// package doc.
func (s *rateLimitService) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	e, err := s.engine()
	if err != nil {
		return nil, err
	}
	n := len(req.GetDescriptors())
	if n > MaxDescriptors {
		return nil, status.Errorf(codes.ResourceExhausted, "%d descriptors in one request; at most %d are decided together", n, MaxDescriptors)
	}
	scratch := groups.Get().(*groupScratch)
	defer scratch.release(n)
	rs, ds := scratch.requests[:n], scratch.decisions[:n]
	if err := rateLimitRequests(e.Policy(), req, rs); err != nil {
		return nil, err
	}
	start := time.Now()
	allowed, err := e.DecideAll(ctx, rs, ds)
	if err != nil {
		var re *enforcer.RequestError
		if errors.As(err, &re) && re.Index >= 0 && re.Index < n {
			if level, ok := enforcer.RefusedAt(re.Err); ok {
				return refusedRateLimit(n, re.Index, level, re.Err), nil
			}
			if errors.Is(re.Err, enforcer.ErrInvalidRequest) {
				// A value Envoy copied from the client's request (a space in
				// X-Api-Key, a 300-byte X-Tenant) is the client's doing: an
				// error would be let through by Envoy's default failure mode.
				return refusedRateLimit(n, re.Index, enforcer.LevelNone, fmt.Errorf("descriptor %d: %w", re.Index, re.Err)), nil
			}
		}
		return nil, engineStatus(err)
	}
	took := time.Since(start)
	for i := range n {
		// A request of a denied group that would have passed was not
		// admitted: only the denials of such a group are counted.
		if allowed || !ds[i].Allow {
			s.observe(&rs[i], &ds[i], took)
		}
	}
	return rateLimitResponse(rs, ds, allowed), nil
}

// groupScratch holds a call's requests and decisions: reused (groups), so
// that a call allocates neither.
type groupScratch struct {
	requests  [MaxDescriptors]enforcer.Request
	decisions [MaxDescriptors]enforcer.Decision
}

var groups = sync.Pool{New: func() any { return new(groupScratch) }}

// release clears the first n of each (the requests point into the call's
// message) and returns g to the pool.
func (g *groupScratch) release(n int) {
	clear(g.requests[:n])
	clear(g.decisions[:n])
	groups.Put(g)
}

// rateLimitRequests turns req's descriptors into rs (one each, in order)
// under p's descriptor mapping. The error, a gRPC status, says what is
// wrong and with which descriptor; nothing is decided then.
func rateLimitRequests(p *policy.Policy, req *rlsv3.RateLimitRequest, rs []enforcer.Request) error {
	if req.GetDomain() != p.Plane() {
		return status.Errorf(codes.InvalidArgument, "domain %q is not served here: this enforcer serves domain %q (its QuotaPlane's name)", clip(req.GetDomain()), p.Plane())
	}
	if len(req.GetDescriptors()) == 0 {
		return status.Error(codes.InvalidArgument, "no descriptors: send at least one, with a tenant entry")
	}
	m := p.Descriptors()
	for i, d := range req.GetDescriptors() {
		if err := rateLimitRequest(m, req.GetHitsAddend(), d, &rs[i]); err != nil {
			return status.Errorf(codes.InvalidArgument, "descriptor %d: %v", i, err)
		}
	}
	return nil
}

// rateLimitRequest turns one descriptor into r.
func rateLimitRequest(m *policy.Descriptors, requestHits uint32, d *ratelimitv3.RateLimitDescriptor, r *enforcer.Request) error {
	entries := d.GetEntries()
	if len(entries) > MaxEntries {
		return fmt.Errorf("%d entries; at most %d", len(entries), MaxEntries)
	}
	var (
		found bool
		err   error
	)
	if r.Tenant, found, err = entry(entries, m.Tenant); err != nil {
		return err
	} else if !found {
		return fmt.Errorf("no tenant entry: looked for the key %s (the QuotaPlane's spec.descriptors.tenant)", strings.Join(quoteAll(m.Tenant), " or "))
	}
	if r.Endpoint, _, err = entry(entries, m.Endpoint); err != nil {
		return err
	}
	if r.APIKey, _, err = entry(entries, m.APIKey); err != nil {
		return err
	}
	if d.GetIsNegativeHits() {
		return errors.New("is_negative_hits: quotaplane does not give tokens back; a denied request consumed none")
	}
	hits := uint64(requestHits)
	if d.GetHitsAddend() != nil {
		hits = d.GetHitsAddend().GetValue()
	}
	if hits > enforcer.MaxUnits {
		return fmt.Errorf("hits_addend %d out of range [0, %d]", hits, enforcer.MaxUnits)
	}
	r.Units = int64(hits)
	return nil // the values are validated by DecideAll: see ShouldRateLimit
}

// entry finds the value of the first of keys present in entries. A key
// that names a request's field must appear once.
func entry(entries []*ratelimitv3.RateLimitDescriptor_Entry, keys []string) (value string, found bool, err error) {
	for _, k := range keys {
		for i, e := range entries {
			if e.GetKey() != k {
				continue
			}
			for _, again := range entries[i+1:] {
				if again.GetKey() == k {
					return "", false, fmt.Errorf("the entry %q appears twice", k)
				}
			}
			return e.GetValue(), true, nil
		}
	}
	return "", false, nil
}

func quoteAll(keys []string) []string {
	q := make([]string, len(keys))
	for i, k := range keys {
		q[i] = fmt.Sprintf("%q", k)
	}
	return q
}

// rateLimitResponse answers decided requests: one status per descriptor,
// and the response headers of the descriptor that denied the group, or of
// the tightest one (the fewest tokens left) when the group passed. The
// messages of the statuses are allocated together, one array of each kind.
func rateLimitResponse(rs []enforcer.Request, ds []enforcer.Decision, allowed bool) *rlsv3.RateLimitResponse {
	n := len(ds)
	resp := &rlsv3.RateLimitResponse{
		OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses:    make([]*rlsv3.RateLimitResponse_DescriptorStatus, n),
	}
	if !allowed {
		resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	statuses := make([]rlsv3.RateLimitResponse_DescriptorStatus, n)
	currentLimits := make([]rlsv3.RateLimitResponse_RateLimit, n)
	untilResets := make([]durationpb.Duration, n)
	denier, tightest := -1, 0
	for i := range ds {
		limits := ds[i].Limits(&rs[i])
		fillDescriptorStatus(&statuses[i], &currentLimits[i], &untilResets[i], &limits, &ds[i])
		resp.Statuses[i] = &statuses[i]
		if !ds[i].Allow && denier < 0 {
			denier = i
		}
		if ds[i].Remaining < ds[tightest].Remaining {
			tightest = i
		}
	}
	pick := tightest
	if denier >= 0 {
		pick = denier
	}
	limits := ds[pick].Limits(&rs[pick])
	fields := new([5]corev3.HeaderValue) // Each adds at most 5
	resp.ResponseHeadersToAdd = make([]*corev3.HeaderValue, 0, len(fields))
	quotaheaders.Each(&limits, &ds[pick], func(name, value string) {
		f := &fields[len(resp.ResponseHeadersToAdd)]
		f.Key, f.Value = name, value
		resp.ResponseHeadersToAdd = append(resp.ResponseHeadersToAdd, f)
	})
	return resp
}

// descriptorStatus is decision d under limits as Envoy reads it: see
// fillDescriptorStatus.
func descriptorStatus(limits *[len(enforcer.Levels)]*policy.Limit, d *enforcer.Decision) *rlsv3.RateLimitResponse_DescriptorStatus {
	st := &rlsv3.RateLimitResponse_DescriptorStatus{}
	fillDescriptorStatus(st, &rlsv3.RateLimitResponse_RateLimit{}, &durationpb.Duration{}, limits, d)
	return st
}

// fillDescriptorStatus fills st with decision d under limits as Envoy
// reads it: the code, and the limit (into current), remaining tokens and
// time until reset (into until) of the level that bounds the answer.
func fillDescriptorStatus(st *rlsv3.RateLimitResponse_DescriptorStatus, current *rlsv3.RateLimitResponse_RateLimit, until *durationpb.Duration,
	limits *[len(enforcer.Levels)]*policy.Limit, d *enforcer.Decision) {
	st.Code = rlsv3.RateLimitResponse_OK
	if !d.Allow {
		st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	st.LimitRemaining = clampUint32(d.Remaining)
	bound := boundLimit(limits, d.Bound)
	if bound != nil {
		fillRateLimit(current, d.Bound, bound)
		st.CurrentLimit = current
	}
	if wait := untilReset(bound, d); wait > 0 {
		until.Seconds, until.Nanos = int64(wait/time.Second), int32(wait%time.Second)
		st.DurationUntilReset = until
	}
}

func boundLimit(limits *[len(enforcer.Levels)]*policy.Limit, level enforcer.Level) *policy.Limit {
	for i, l := range enforcer.Levels {
		if l == level {
			return limits[i]
		}
	}
	return nil
}

// untilReset is, on a denial, the wait until the request would pass;
// when allowed, the time until the bounding bucket is full again, as the
// RateLimit header's t says (a sliding window, or a bucket that does not
// refill: its period).
func untilReset(l *policy.Limit, d *enforcer.Decision) time.Duration {
	switch {
	case !d.Allow:
		return d.RetryAfter
	case l == nil:
		return 0
	case l.Algorithm == policy.SlidingWindow || l.Rate == 0:
		return l.Period
	default:
		missing := max(l.Burst-d.Remaining, 0)
		return time.Duration(math.Ceil(float64(missing) * float64(l.Period) / float64(l.Rate)))
	}
}

// Envoy's units, longest first, with their lengths.
var units = [...]struct {
	length time.Duration
	unit   rlsv3.RateLimitResponse_RateLimit_Unit
}{
	{24 * time.Hour, rlsv3.RateLimitResponse_RateLimit_DAY},
	{time.Hour, rlsv3.RateLimitResponse_RateLimit_HOUR},
	{time.Minute, rlsv3.RateLimitResponse_RateLimit_MINUTE},
	{time.Second, rlsv3.RateLimitResponse_RateLimit_SECOND},
}

// rateLimitOf is limit l of a level as Envoy's RateLimit: l.Rate per
// period, in the longest unit the period is a whole number of (with
// unit_multiplier when more than one: 100 per 300s is 100 per 5 MINUTE);
// a period that is not a whole number of seconds is scaled to a rate per
// second, rounded, at least 1 when l refills at all.
func rateLimitOf(level enforcer.Level, l *policy.Limit) *rlsv3.RateLimitResponse_RateLimit {
	rl := &rlsv3.RateLimitResponse_RateLimit{}
	fillRateLimit(rl, level, l)
	return rl
}

func fillRateLimit(rl *rlsv3.RateLimitResponse_RateLimit, level enforcer.Level, l *policy.Limit) {
	rl.Name = string(level)
	for _, u := range units {
		if l.Period%u.length == 0 {
			rl.RequestsPerUnit, rl.Unit = clampUint32(l.Rate), u.unit
			if n := l.Period / u.length; n > 1 {
				rl.UnitMultiplier = wrapperspb.UInt32(uint32(min(int64(n), math.MaxUint32)))
			}
			return
		}
	}
	perSecond := math.Round(float64(l.Rate) * float64(time.Second) / float64(l.Period))
	if l.Rate > 0 {
		perSecond = max(perSecond, 1)
	}
	rl.RequestsPerUnit, rl.Unit = clampUint32(int64(min(perSecond, math.MaxUint32))), rlsv3.RateLimitResponse_RateLimit_SECOND
}

func clampUint32(v int64) uint32 { return uint32(min(max(v, 0), math.MaxUint32)) }

// refusedRateLimit answers a group of n whose descriptor i was refused:
// OVER_LIMIT for it, UNKNOWN for the others (nothing was decided), and
// X-Quota-Level and X-Quota-Reason saying why.
func refusedRateLimit(n, i int, level enforcer.Level, err error) *rlsv3.RateLimitResponse {
	resp := &rlsv3.RateLimitResponse{
		OverallCode:          rlsv3.RateLimitResponse_OVER_LIMIT,
		Statuses:             make([]*rlsv3.RateLimitResponse_DescriptorStatus, n),
		ResponseHeadersToAdd: []*corev3.HeaderValue{{Key: quotaheaders.Reason, Value: quotaheaders.Text(err.Error(), quotaheaders.MaxReasonBytes)}},
	}
	if level != enforcer.LevelNone {
		resp.ResponseHeadersToAdd = append(resp.ResponseHeadersToAdd, &corev3.HeaderValue{Key: quotaheaders.Level, Value: string(level)})
	}
	for j := range resp.Statuses {
		resp.Statuses[j] = &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_UNKNOWN}
	}
	resp.Statuses[i].Code = rlsv3.RateLimitResponse_OVER_LIMIT
	return resp
}

// engineStatus is an engine error that is not an answer about the
// request, as a gRPC status: Envoy's failure mode decides what happens.
func engineStatus(err error) error {
	switch {
	case errors.Is(err, enforcer.ErrInvalidRequest):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, enforcer.ErrClosed):
		return status.Error(codes.Unavailable, "the enforcer is shutting down; retry on another instance")
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, "the call ended before a decision")
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, "the call's deadline passed before a decision")
	}
	return status.Error(codes.Internal, err.Error())
}

// clip shortens a value from the wire for an error message.
func clip(s string) string {
	const most = 64
	if len(s) <= most {
		return s
	}
	return s[:most] + "..."
}
