package store

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotaplane/quotaplane/pkg/keyspace"
	"github.com/quotaplane/quotaplane/pkg/lua"
)

// EnforcersKey names the hash where a plane's enforcers report what they
// loaded: field the enforcer's id, value "version:decisions per second:ms
// of Redis TIME until which the report holds" (Redis hashes expire as a
// whole, so each report carries its own expiry; Report drops the lapsed
// ones).
func EnforcersKey(plane string) string { return keyspace.Enforcers(plane) }

// EnforcerStatesKey names the hash beside EnforcersKey where each enforcer
// reports its state with its report: field the enforcer's id, value
// "mode:degraded" (degraded 0 or 1). The state is a hash of its own rather
// than two more fields of the report's value because enforcers and
// managers of earlier versions take a report value of any other shape for
// garbage and delete it: in a rolling upgrade they keep the later
// enforcers' reports, and a report without a state (an earlier
// enforcer's) reads with an empty Mode.
func EnforcerStatesKey(plane string) string { return keyspace.EnforcerStates(plane) }

// EnforcerReport is what one enforcer said it runs.
type EnforcerReport struct {
	ID              string
	PolicyVersion   int64
	DecisionsPerSec float64
	Until           time.Time // the report lapses then, unless renewed
	// Mode is the backend the enforcer runs the plane in (local, central,
	// local-reconciled); empty when the enforcer did not say (an earlier
	// version).
	Mode string
	// Degraded says that Redis was unavailable to the enforcer and the
	// plane's failureMode decided (its circuit breaker open). An enforcer
	// that cannot reach Redis cannot report either: its report lapses.
	Degraded bool
}

// Report records that enforcer id runs policy version at decisions per
// second, for ttl, without a state (ReportState).
func (s *Store) Report(ctx context.Context, id string, version int64, decisionsPerSec float64, ttl time.Duration) error {
	return s.ReportState(ctx, EnforcerReport{ID: id, PolicyVersion: version, DecisionsPerSec: decisionsPerSec}, ttl)
}

// ReportState records r (but its Until) for ttl: an enforcer renews it
// every heartbeat; the manager reads the reports with Enforcers, and the
// enforcers' debug view shows them as the fleet. A report with a Mode
// records the state too. The report lapses ttl after Redis's now (TIME),
// not the host's: liveness is judged on one clock (report.lua, which also
// drops the reports that lapsed).
func (s *Store) ReportState(ctx context.Context, r EnforcerReport, ttl time.Duration) error {
	if r.ID == "" || strings.Contains(r.ID, ":") {
		return fmt.Errorf("store: plane %q: enforcer id %q: it must be non-empty and without ':'", s.plane, r.ID)
	}
	if strings.Contains(r.Mode, ":") {
		return fmt.Errorf("store: plane %q: enforcer %s: mode %q has a ':'", s.plane, r.ID, r.Mode)
	}
	var state string
	if r.Mode != "" {
		state = r.Mode + ":0"
		if r.Degraded {
			state = r.Mode + ":1"
		}
	}
	_, err := lua.RunReport(ctx, s.client, EnforcersKey(s.plane), EnforcerStatesKey(s.plane),
		lua.ReportArgs{ID: r.ID, Version: r.PolicyVersion, Rate: r.DecisionsPerSec, TTLMs: max(ttl.Milliseconds(), 1), State: state})
	if err != nil {
		return fmt.Errorf("store: plane %q: report enforcer %s: %w", s.plane, r.ID, err)
	}
	return nil
}

// Enforcers returns the reports that have not lapsed by Redis's clock
// (TIME, read with them), sorted by id. Until is on that clock too.
func (s *Store) Enforcers(ctx context.Context) ([]EnforcerReport, error) {
	var all, states *redis.MapStringStringCmd
	var now *redis.TimeCmd
	_, err := s.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		all = p.HGetAll(ctx, EnforcersKey(s.plane))
		states = p.HGetAll(ctx, EnforcerStatesKey(s.plane))
		now = p.Time(ctx)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("store: plane %q: read enforcer reports: %w", s.plane, err)
	}
	var live []EnforcerReport
	for id, value := range all.Val() {
		report, ok := parseReport(id, value, states.Val()[id])
		// Lapsed (by report.lua's measure: in whole ms), or not a report:
		// report.lua drops it.
		if ok && !report.Until.Before(now.Val().Truncate(time.Millisecond)) {
			live = append(live, report)
		}
	}
	slices.SortFunc(live, func(a, b EnforcerReport) int { return strings.Compare(a.ID, b.ID) })
	return live, nil
}

// parseReport reads a report's value and its state (empty when there is
// none); ok is false when the value is not a report. A state that is not
// one reads as none: the report stands.
func parseReport(id, value, state string) (EnforcerReport, bool) {
	parts := strings.Split(value, ":")
	if len(parts) != 3 {
		return EnforcerReport{}, false
	}
	version, err1 := strconv.ParseInt(parts[0], 10, 64)
	rate, err2 := strconv.ParseFloat(parts[1], 64)
	until, err3 := strconv.ParseInt(parts[2], 10, 64)
	if err1 != nil || err2 != nil || err3 != nil {
		return EnforcerReport{}, false
	}
	r := EnforcerReport{ID: id, PolicyVersion: version, DecisionsPerSec: rate, Until: time.UnixMilli(until)}
	if mode, degraded, ok := strings.Cut(state, ":"); ok && mode != "" && (degraded == "0" || degraded == "1") {
		r.Mode, r.Degraded = mode, degraded == "1"
	}
	return r, true
}
