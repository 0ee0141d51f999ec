package controllers

import (
	"math"
	"slices"
	"sync"
	"time"

	"github.com/quotaplane/quotaplane/pkg/policy"
)

// Fleet scaling: the enforcer Deployment gets enough replicas for the
// observed decision rate (the sum of what the enforcers report) at
// targetRatePerReplica each, within minReplicas and maxReplicas. Two
// hysteresis rules keep it from flapping, after the HorizontalPodAutoscaler:
//
//   - a tolerance: while the rate is within ±10% of what the current
//     replicas are sized for, the recommendation is the current count;
//   - scale up at once, scale down slowly: a lower count is applied only
//     when every recommendation of the last scaleDownDelay was that low (the
//     fleet shrinks to the highest of them).
//
// Without targetRatePerReplica, or while no enforcer reports, the replicas
// are only kept within min and max.

// scaleTolerance is the relative rate change the current replicas absorb.
const scaleTolerance = 0.1

// recommend is the replica count for rate at target per replica, holding
// current while the rate is within the tolerance of it.
func recommend(rate float64, current int32, target int64) int32 {
	if current > 0 && math.Abs(rate/(float64(current)*float64(target))-1) <= scaleTolerance {
		return current
	}
	return int32(min(math.Ceil(rate/float64(target)), math.MaxInt32))
}

type recommendation struct {
	at       time.Time
	replicas int32
}

// scaler remembers each fleet's recent recommendations for slow scale-down.
type scaler struct {
	delay   time.Duration
	mu      sync.Mutex
	history map[string][]recommendation // by the plane's namespace
}

// replicas is how many replicas the fleet key should have at now, given its
// current count and the observed rate (reporting says whether any enforcer
// reported one).
func (s *scaler) replicas(key string, now time.Time, current int32, rate float64, reporting bool, f policy.Enforcer) int32 {
	want := current
	if f.TargetRatePerReplica > 0 && reporting {
		want = recommend(rate, current, f.TargetRatePerReplica)
	}
	want = min(max(want, f.MinReplicas), f.MaxReplicas)

	s.mu.Lock()
	defer s.mu.Unlock()
	if s.history == nil {
		s.history = map[string][]recommendation{}
	}
	h, seen := s.history[key]
	if !seen {
		// First sight (a restart, a new leader): the current count counts
		// as recommended now, so the delay holds from here.
		h = []recommendation{{now, current}}
	}
	// h is a sliding-window maximum: recommendations newer than the delay,
	// each higher than every later one, so h[0] is the highest of the
	// window and the length is bounded by the distinct counts.
	h = slices.DeleteFunc(h, func(r recommendation) bool { return now.Sub(r.at) > s.delay })
	for len(h) > 0 && h[len(h)-1].replicas <= want {
		h = h[:len(h)-1]
	}
	h = append(h, recommendation{now, want})
	s.history[key] = h
	if want >= current {
		return want
	}
	return min(current, h[0].replicas, f.MaxReplicas)
}

// forget drops a fleet's history (its plane is gone).
func (s *scaler) forget(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.history, key)
}
