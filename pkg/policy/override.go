package policy

import (
	"fmt"
	"time"
)

// Overrides are the enforcer's command-line overrides of a plane's values
// (seed 002 §8: -mode, -fairness, -reconcile-ms, -burst-pool, -global-rps;
// and -share-by).
// A zero field overrides nothing.
type Overrides struct {
	Mode              string
	Fairness          string
	ShareBy           string
	ReconcileInterval time.Duration
	// BurstPoolSize sets the burst pool's size (its per-tenant ceiling is
	// capped to it); the plane must have a pool.
	BurstPoolSize int64
	// GlobalPerSecond sets the global limit to this many tokens per
	// second; its burst stays, unless below the new rate, then equals it.
	GlobalPerSecond int64
}

// Empty reports whether o overrides nothing.
func (o Overrides) Empty() bool { return o == Overrides{} }

// Override returns p with o applied, validated as any policy is. The
// result keeps p's version; its hash is its own content's.
func (p *Policy) Override(o Overrides) (*Policy, error) {
	if o.Empty() {
		return p, nil
	}
	spec := p.spec
	if o.Mode != "" {
		spec.Mode = o.Mode
	}
	if o.Fairness != "" {
		spec.Fairness = o.Fairness
	}
	if o.ShareBy != "" {
		spec.ShareBy = shareBy(o.ShareBy)
	}
	if o.ReconcileInterval != 0 {
		spec.ReconcileInterval = o.ReconcileInterval
	}
	if o.BurstPoolSize != 0 {
		if spec.BurstPool == nil {
			return nil, fmt.Errorf("override of plane %s: the burst pool size is set, but the plane has no BurstPool", p.ID())
		}
		bp := *spec.BurstPool
		bp.Size = o.BurstPoolSize
		bp.PerTenantCeiling = min(bp.PerTenantCeiling, bp.Size)
		spec.BurstPool = &bp
	}
	if o.GlobalPerSecond != 0 {
		spec.Global = Limit{Rate: o.GlobalPerSecond, Burst: max(spec.Global.Burst, o.GlobalPerSecond), Period: time.Second, Algorithm: TokenBucket}
		if spec.Global.Burst*spec.Global.PeriodMicros() > MaxScaledLevel {
			spec.Global.Burst = o.GlobalPerSecond
		}
	}
	q, err := newPolicy(spec)
	if err != nil {
		return nil, fmt.Errorf("override of plane %s: %w", p.ID(), err)
	}
	q.version = p.version
	return q, nil
}
