package store

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// EnforcersKey names the hash where a plane's enforcers report what they
// loaded: field the enforcer's id, value "version:decisions per second:ms
// until which the report holds" (Redis hashes expire as a whole, so each
// report carries its own expiry; Report drops the lapsed ones).
func EnforcersKey(plane string) string { return "qp:{" + plane + "}:enforcers" }

// EnforcerReport is what one enforcer said it runs.
type EnforcerReport struct {
	ID              string
	PolicyVersion   int64
	DecisionsPerSec float64
	Until           time.Time // the report lapses then, unless renewed
}

// Report records that enforcer id runs policy version at decisions per
// second, for ttl (an enforcer renews it every heartbeat; the manager reads
// them with Enforcers).
func (s *Store) Report(ctx context.Context, id string, version int64, decisionsPerSec float64, ttl time.Duration) error {
	if id == "" || strings.Contains(id, ":") {
		return fmt.Errorf("store: plane %q: enforcer id %q: it must be non-empty and without ':'", s.plane, id)
	}
	now := time.Now()
	value := fmt.Sprintf("%d:%g:%d", version, decisionsPerSec, now.Add(ttl).UnixMilli())
	key := EnforcersKey(s.plane)
	if err := s.client.HSet(ctx, key, id, value).Err(); err != nil {
		return fmt.Errorf("store: plane %q: report enforcer %s: %w", s.plane, id, err)
	}
	// The hash lives as long as some report does; lapsed ones are dropped.
	if err := s.client.PExpire(ctx, key, 2*ttl).Err(); err != nil {
		return fmt.Errorf("store: plane %q: report enforcer %s: %w", s.plane, id, err)
	}
	reports, err := s.reports(ctx, now)
	if err != nil {
		return err
	}
	if len(reports.lapsed) > 0 {
		return s.client.HDel(ctx, key, reports.lapsed...).Err()
	}
	return nil
}

// Enforcers returns the reports that have not lapsed, sorted by id.
func (s *Store) Enforcers(ctx context.Context) ([]EnforcerReport, error) {
	r, err := s.reports(ctx, time.Now())
	return r.live, err
}

type reports struct {
	live   []EnforcerReport
	lapsed []string
}

func (s *Store) reports(ctx context.Context, now time.Time) (reports, error) {
	all, err := s.client.HGetAll(ctx, EnforcersKey(s.plane)).Result()
	if err != nil {
		return reports{}, fmt.Errorf("store: plane %q: read enforcer reports: %w", s.plane, err)
	}
	var r reports
	for id, value := range all {
		parts := strings.Split(value, ":")
		if len(parts) != 3 {
			r.lapsed = append(r.lapsed, id) // not a report: drop it
			continue
		}
		version, err1 := strconv.ParseInt(parts[0], 10, 64)
		rate, err2 := strconv.ParseFloat(parts[1], 64)
		until, err3 := strconv.ParseInt(parts[2], 10, 64)
		if err1 != nil || err2 != nil || err3 != nil || until < now.UnixMilli() {
			r.lapsed = append(r.lapsed, id)
			continue
		}
		r.live = append(r.live, EnforcerReport{ID: id, PolicyVersion: version, DecisionsPerSec: rate, Until: time.UnixMilli(until)})
	}
	slices.SortFunc(r.live, func(a, b EnforcerReport) int { return strings.Compare(a.ID, b.ID) })
	return r, nil
}
