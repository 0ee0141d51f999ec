package enforcer

import "github.com/quotaplane/quotaplane/pkg/policy"

// tenantRecord is what a snapshot resolves once about a tenant, so that
// neither a decision nor a tenant's move to a new policy looks the policy
// up again: the effective limits (policy.Tenant) and what derives from
// them. A snapshot holds one per tenant the policy names and one per tier
// for the tenants it does not (Name empty there: the record is shared);
// tenant states point at theirs. Immutable.
type tenantRecord struct {
	// What a decision reads first.
	//
	// slot maps an endpoint's index in the snapshot to its place in
	// endpoints, -1 where the tenant has no limit; nil when it has none on
	// any endpoint. It is slots, in the record's own memory, for a plane
	// of up to len(slots) endpoints.
	slot      []int32
	slots     [8]int32
	mayBorrow bool // policy.MayBorrow
	tierRank  int  // index in policy order, 0 the most protected
	// endpoints are the endpoints on which the tenant has a limit
	// (policy.EndpointLimit), in the snapshot's order; its state's
	// endpoint limiters are aligned with them.
	endpoints []recordEndpoint
	tenant    policy.Tenant
}

// recordEndpoint is an endpoint on which a tenant has a limit.
type recordEndpoint struct {
	ep  int // index in the snapshot's endpoints
	lim *policy.Limit
}

// endpointSlot is the place of the tenant's limiter for endpoint ep (an
// index in the snapshot's endpoints, or -1 for none) in its state's
// endpoints, -1 when it has no limit there.
func (r *tenantRecord) endpointSlot(ep int) int {
	if ep < 0 || r.slot == nil {
		return -1
	}
	return int(r.slot[ep])
}

// resolveRecords builds s's records: the named tenants', each tier's for
// the tenants the policy does not name, and the one of a tenant a plane
// that denies unknown tenants does not let through (the zero tenant:
// such a tenant is refused before it decides; the record keeps the state
// of one that raced a policy change well-defined).
func (s *snapshot) resolveRecords() {
	p := s.policy
	spec := p.Spec()
	newRecord := func(t policy.Tenant) *tenantRecord {
		rec := &tenantRecord{tenant: t, tierRank: s.tierRank[t.Tier], mayBorrow: p.MayBorrow(&t)}
		for i := range s.endpoints {
			if lim := p.EndpointLimit(&rec.tenant, i); lim != nil {
				if rec.slot == nil {
					if len(s.endpoints) <= len(rec.slots) {
						rec.slot = rec.slots[:len(s.endpoints)]
					} else {
						rec.slot = make([]int32, len(s.endpoints))
					}
					for j := range rec.slot {
						rec.slot[j] = -1
					}
				}
				rec.slot[i] = int32(len(rec.endpoints))
				rec.endpoints = append(rec.endpoints, recordEndpoint{ep: i, lim: lim})
			}
		}
		return rec
	}
	s.records = make(map[string]*tenantRecord, len(spec.Tenants))
	for _, t := range spec.Tenants {
		s.records[t.Name] = newRecord(t)
	}
	s.tierRecords = make(map[string]*tenantRecord, len(spec.Tiers))
	s.deniedRecord = newRecord(policy.Tenant{})
	for _, tr := range spec.Tiers {
		if t, ok := p.DefaultTenant("", tr.Name); ok {
			s.tierRecords[tr.Name] = newRecord(t)
		}
	}
	s.defaultRecord = s.tierRecords[spec.DefaultTier]
	if s.defaultRecord == nil {
		s.defaultRecord = s.deniedRecord
	}
}

// recordOf is the record of the tenant named name that asks for tier (which
// matters only to a tenant the policy does not name: policy.DefaultTenant),
// and whether the policy names it.
func (s *snapshot) recordOf(name, tier string) (rec *tenantRecord, known bool) {
	if rec := s.records[name]; rec != nil {
		return rec, true
	}
	if rec := s.tierRecords[tier]; rec != nil {
		return rec, false
	}
	return s.defaultRecord, false
}
