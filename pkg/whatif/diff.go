package whatif

import (
	"cmp"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/quotaplane/quotaplane/pkg/policy"
	"github.com/quotaplane/quotaplane/pkg/report"
)

// The levels of a Diff's changes, in the order it lists them.
var DiffLevels = []string{"plane", "global", "tier", "burstPool", "endpoint", "tenant", "key"}

// Change is one field that differs between two policies. Old or New is
// empty when the object (or the field's limit) is absent on that side.
type Change struct {
	Level  string `json:"level"`
	Object string `json:"object,omitempty"`
	Field  string `json:"field"`
	Old    string `json:"old"`
	New    string `json:"new"`
}

// TierTenants counts, for one tier, the tenants the plane names in it on
// each side and how many a change touches: added to the tier (a new tenant
// or one moved in), removed from it (deleted or moved out), or changed in
// place (limits, weight, keys, endpoints...).
type TierTenants struct {
	Tier    string `json:"tier"`
	Before  int    `json:"before"`
	After   int    `json:"after"`
	Added   int    `json:"added"`
	Removed int    `json:"removed"`
	Changed int    `json:"changed"`
	// DefaultsChanged says the tier's own tenant or key limits changed:
	// they apply also to every tenant of the tier the plane does not name.
	DefaultsChanged bool `json:"defaultsChanged"`
}

// PolicyRef names one side of a diff.
type PolicyRef struct {
	Source string `json:"source"`
	Plane  string `json:"plane"`
	Hash   string `json:"hash"`
}

// Diff is what changes from Old to New.
type Diff struct {
	Old     PolicyRef     `json:"old"`
	New     PolicyRef     `json:"new"`
	Changes []Change      `json:"changes"`
	Tiers   []TierTenants `json:"tiers"`
}

// Compare lists what changes from old to new (compiled from the sources
// named oldSource and newSource), level by level in DiffLevels' order,
// objects by name, and counts the changed tenants of each tier.
func Compare(oldSource string, old *policy.Policy, newSource string, new *policy.Policy) *Diff {
	d := &Diff{
		Old:     PolicyRef{Source: oldSource, Plane: old.ID(), Hash: old.Hash()},
		New:     PolicyRef{Source: newSource, Plane: new.ID(), Hash: new.Hash()},
		Changes: []Change{},
	}
	o, n := old.Spec(), new.Spec()
	add := func(level, object, field, a, b string) {
		if a != b {
			d.Changes = append(d.Changes, Change{Level: level, Object: object, Field: field, Old: a, New: b})
		}
	}

	add("plane", "", "plane", old.ID(), new.ID())
	add("plane", "", "mode", o.Mode, n.Mode)
	add("plane", "", "failureMode", o.FailureMode, n.FailureMode)
	add("plane", "", "fairness", o.Fairness, n.Fairness)
	add("plane", "", "shareBy", cmp.Or(o.ShareBy, policy.ShareByTenant), cmp.Or(n.ShareBy, policy.ShareByTenant))
	add("plane", "", "reconcileInterval", o.ReconcileInterval.String(), n.ReconcileInterval.String())
	add("plane", "", "shards", itoa(o.Shards), itoa(n.Shards))
	add("plane", "", "defaultTier", o.DefaultTier, n.DefaultTier)
	add("plane", "", "unknownTenants", o.UnknownTenants, n.UnknownTenants)
	add("plane", "", "unknownEndpoints", o.UnknownEndpoints, n.UnknownEndpoints)
	add("plane", "", "keyBinding", o.KeyBinding, n.KeyBinding)
	add("plane", "", "descriptors", jsonOf(o.Descriptors), jsonOf(n.Descriptors))
	add("plane", "", "enforcer", jsonOf(o.Enforcer), jsonOf(n.Enforcer))
	add("global", "", "limit", o.Global.String(), n.Global.String())

	tierDefaults := map[string]bool{}
	eachPair(o.Tiers, n.Tiers, func(t policy.Tier) string { return t.Name }, func(name string, a, b *policy.Tier) {
		if a == nil || b == nil {
			add("tier", name, "tier", tierSummary(old, a), tierSummary(new, b))
			tierDefaults[name] = true
			return
		}
		add("tier", name, "weight", itoa(a.Weight), itoa(b.Weight))
		add("tier", name, "floorPercent", itoa(a.FloorPercent), itoa(b.FloorPercent))
		add("tier", name, "tenant limit", limitString(a.Tenant), limitString(b.Tenant))
		add("tier", name, "key limit", limitString(a.Key), limitString(b.Key))
		add("tier", name, "hard", strconv.FormatBool(a.Hard), strconv.FormatBool(b.Hard))
		add("tier", name, "priorityBase", ftoa(old.PriorityBase(name)), ftoa(new.PriorityBase(name)))
		tierDefaults[name] = limitString(a.Tenant) != limitString(b.Tenant) || limitString(a.Key) != limitString(b.Key)
	})

	switch {
	case o.BurstPool == nil && n.BurstPool == nil:
	case o.BurstPool == nil || n.BurstPool == nil:
		add("burstPool", "", "pool", poolSummary(o.BurstPool), poolSummary(n.BurstPool))
	default:
		a, b := o.BurstPool, n.BurstPool
		add("burstPool", "", "size", itoa(a.Size), itoa(b.Size))
		add("burstPool", "", "refillRate", itoa(a.RefillRate), itoa(b.RefillRate))
		add("burstPool", "", "perTenantCeiling", itoa(a.PerTenantCeiling), itoa(b.PerTenantCeiling))
		add("burstPool", "", "tiers", strings.Join(a.Tiers, ","), strings.Join(b.Tiers, ","))
	}

	eachPair(o.Endpoints, n.Endpoints, func(e policy.Endpoint) string { return e.Name }, func(name string, a, b *policy.Endpoint) {
		if a == nil || b == nil {
			add("endpoint", name, "endpoint", endpointSummary(a), endpointSummary(b))
			return
		}
		add("endpoint", name, "cost", itoa(a.Cost), itoa(b.Cost))
		add("endpoint", name, "limit", limitString(a.Limit), limitString(b.Limit))
		eachPair(a.Tiers, b.Tiers, func(t policy.TierLimit) string { return t.Tier }, func(tier string, x, y *policy.TierLimit) {
			add("endpoint", name, "tier "+tier+" limit", tierLimitString(x), tierLimitString(y))
		})
		add("endpoint", name, "match", jsonOf(a.Match), jsonOf(b.Match))
	})

	counts := map[string]*TierTenants{}
	tierCount := func(tier string) *TierTenants {
		if counts[tier] == nil {
			counts[tier] = &TierTenants{Tier: tier, DefaultsChanged: tierDefaults[tier]}
		}
		return counts[tier]
	}
	for _, t := range o.Tiers {
		tierCount(t.Name)
	}
	for _, t := range n.Tiers {
		tierCount(t.Name)
	}
	eachPair(o.Tenants, n.Tenants, func(t policy.Tenant) string { return t.Name }, func(name string, a, b *policy.Tenant) {
		if a != nil {
			tierCount(a.Tier).Before++
		}
		if b != nil {
			tierCount(b.Tier).After++
		}
		if a == nil || b == nil {
			add("tenant", name, "tenant", tenantSummary(a), tenantSummary(b))
			if a == nil {
				tierCount(b.Tier).Added++
			} else {
				tierCount(a.Tier).Removed++
			}
			return
		}
		before := len(d.Changes)
		add("tenant", name, "tier", a.Tier, b.Tier)
		add("tenant", name, "limit", limitString(a.Limit), limitString(b.Limit))
		add("tenant", name, "weight", itoa(a.Weight), itoa(b.Weight))
		add("tenant", name, "hard", strconv.FormatBool(a.Hard), strconv.FormatBool(b.Hard))
		add("tenant", name, "shards", itoa(a.Shards), itoa(b.Shards))
		add("tenant", name, "priority", jsonOf(a.Priority), jsonOf(b.Priority))
		add("tenant", name, "bound api keys", strconv.Itoa(len(a.KeyHashes)), strconv.Itoa(len(b.KeyHashes)))
		eachPair(a.Endpoints, b.Endpoints, func(e policy.EndpointLimit) string { return e.Endpoint }, func(ep string, x, y *policy.EndpointLimit) {
			add("tenant", name, "endpoint "+ep+" limit", endpointLimitString(x), endpointLimitString(y))
		})
		eachPair(a.Keys, b.Keys, func(k policy.KeyLimit) string { return k.Key }, func(key string, x, y *policy.KeyLimit) {
			add("key", name+"/"+key, "limit", keyLimitString(x), keyLimitString(y))
		})
		switch {
		case a.Tier != b.Tier:
			tierCount(a.Tier).Removed++
			tierCount(b.Tier).Added++
		case len(d.Changes) > before:
			tierCount(b.Tier).Changed++
		}
	})
	slices.SortStableFunc(d.Changes, func(a, b Change) int {
		return cmp.Compare(slices.Index(DiffLevels, a.Level), slices.Index(DiffLevels, b.Level))
	})
	// Tiers in the new policy's priority order, then those it dropped.
	for _, t := range n.Tiers {
		d.Tiers = append(d.Tiers, *counts[t.Name])
		delete(counts, t.Name)
	}
	for _, t := range o.Tiers {
		if c, ok := counts[t.Name]; ok {
			d.Tiers = append(d.Tiers, *c)
			delete(counts, t.Name)
		}
	}
	return d
}

// Empty says whether the two policies enforce the same thing.
func (d *Diff) Empty() bool { return len(d.Changes) == 0 }

// Tables are the changes and the tenants by tier.
func (d *Diff) Tables() []report.Table {
	changes := report.Table{
		Title:  fmt.Sprintf("policy %s (%s, hash %s) -> %s (%s, hash %s)", d.Old.Plane, d.Old.Source, short(d.Old.Hash), d.New.Plane, d.New.Source, short(d.New.Hash)),
		Header: []string{"LEVEL", "OBJECT", "FIELD", "OLD", "NEW"},
	}
	for _, c := range d.Changes {
		changes.Rows = append(changes.Rows, []string{c.Level, c.Object, c.Field, orDash(c.Old), orDash(c.New)})
	}
	if d.Empty() {
		changes.Header = nil
		changes.Notes = []string{"no change: both enforce the same policy"}
		return []report.Table{changes}
	}
	tiers := report.Table{Title: "named tenants by tier", Header: []string{"TIER", "BEFORE", "AFTER", "ADDED", "REMOVED", "CHANGED", "TIER DEFAULTS"}}
	for _, t := range d.Tiers {
		defaults := "same"
		if t.DefaultsChanged {
			defaults = "changed: also every tenant of the tier the plane does not name"
		}
		tiers.Rows = append(tiers.Rows, []string{t.Tier, strconv.Itoa(t.Before), strconv.Itoa(t.After), strconv.Itoa(t.Added), strconv.Itoa(t.Removed), strconv.Itoa(t.Changed), defaults})
	}
	return []report.Table{changes, tiers}
}

// eachPair calls f for every name in a or b, in name order, with nil on
// the side that lacks it.
func eachPair[T any](a, b []T, name func(T) string, f func(string, *T, *T)) {
	names := map[string][2]*T{}
	var order []string
	for i := range a {
		k := name(a[i])
		if _, ok := names[k]; !ok {
			order = append(order, k)
		}
		p := names[k]
		p[0] = &a[i]
		names[k] = p
	}
	for i := range b {
		k := name(b[i])
		if _, ok := names[k]; !ok {
			order = append(order, k)
		}
		p := names[k]
		p[1] = &b[i]
		names[k] = p
	}
	slices.Sort(order)
	for _, k := range order {
		f(k, names[k][0], names[k][1])
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

func ftoa(x float64) string { return strconv.FormatFloat(x, 'g', 4, 64) }

func short(hash string) string { return hash[:min(12, len(hash))] }

func orDash(s string) string { return cmp.Or(s, "-") }

func jsonOf(v any) string {
	b, _ := json.Marshal(v)
	if s := string(b); s != "null" && s != "{}" {
		return s
	}
	return ""
}

func limitString(l *policy.Limit) string {
	if l == nil {
		return "none"
	}
	return l.String()
}

func tierLimitString(t *policy.TierLimit) string {
	if t == nil {
		return ""
	}
	return t.Limit.String()
}

func endpointLimitString(e *policy.EndpointLimit) string {
	if e == nil {
		return ""
	}
	return e.Limit.String()
}

func keyLimitString(k *policy.KeyLimit) string {
	if k == nil {
		return ""
	}
	return k.Limit.String()
}

func tierSummary(p *policy.Policy, t *policy.Tier) string {
	if t == nil {
		return ""
	}
	return fmt.Sprintf("weight %d, floor %d%%, tenant %s, key %s", t.Weight, t.FloorPercent, limitString(t.Tenant), limitString(t.Key))
}

func poolSummary(b *policy.BurstPool) string {
	if b == nil {
		return ""
	}
	return fmt.Sprintf("size %d, refill %d/s, ceiling %d, tiers %s", b.Size, b.RefillRate, b.PerTenantCeiling, strings.Join(b.Tiers, ","))
}

func endpointSummary(e *policy.Endpoint) string {
	if e == nil {
		return ""
	}
	return fmt.Sprintf("cost %d, limit %s", e.Cost, limitString(e.Limit))
}

func tenantSummary(t *policy.Tenant) string {
	if t == nil {
		return ""
	}
	return fmt.Sprintf("tier %s, limit %s, weight %d", t.Tier, limitString(t.Limit), t.Weight)
}
