package enforcer

import (
	"errors"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/pkg/redistest"
)

// TestGroupOneTierPerTenant: an unknown tenant named twice in one group with
// two tiers. Decided alone in order, the second request moves the tenant to
// its tier, iron, whose burst of 20 cannot cover 25: denied. The group
// decided both at the first request's tier (gold, 30 tokens left) and
// admitted what its requests in order would not (found in review). Such a
// group is now refused before anything is decided, in every mode.
func TestGroupOneTierPerTenant(t *testing.T) {
	srv := redistest.Start(t)
	for _, m := range groupModes {
		t.Run(m.name, func(t *testing.T) {
			e := groupEngine(t, srv, m.mode, m.redisDown, groupPlane("test"))
			c := upRedis(e, m.redisDown)
			now := at(time.Hour)
			rs := []Request{
				{Tenant: "u", Tier: "gold", Endpoint: "read", Units: 30},
				{Tenant: "u", Tier: "iron", Endpoint: "read", Units: 25},
			}
			before := stateAt(t, e, c, now)
			ds := make([]Decision, len(rs))
			allowed, err := e.DecideAllAt(now, rs, ds)
			var re *RequestError
			if allowed || !errors.As(err, &re) || re.Index != 1 || !errors.Is(err, ErrInvalidRequest) {
				t.Fatalf("DecideAllAt = %t, %v; want request 1 refused as invalid", allowed, err)
			}
			if after := stateAt(t, e, c, now); after != before {
				t.Fatalf("the refused group moved state: %v → %v", before, after)
			}
			// One tier for the tenant is a group like any other.
			rs[1].Tier = "gold"
			if _, err := e.DecideAllAt(now, rs, ds); err != nil {
				t.Fatal(err)
			}
		})
	}
}
