package policy

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
)

// Policy is a compiled plane: immutable, safe for concurrent use, identified by
// a content hash and, once published, a version.
//
// Slices reachable from the values its methods return are shared with the
// policy and must not be modified.
type Policy struct {
	version int64
	hash    string
	spec    Spec
	encoded []byte // canonical JSON of spec

	tierIndex     map[string]int
	priorityBase  []float64 // each tier's effective base score, 0 to 1, by index
	endpointIndex map[string]int
	tenantIndex   map[string]int
	mayBorrowTier map[string]bool // nil when there is no pool
	endpointFold  map[string]int  // by lower-case name
	keyOwner      map[[32]byte]int
	matches       []compiledMatch // most specific first
}

// Version is the published version; 0 until a publisher (or the enforcer's file
// mode) assigns one with WithVersion.
func (p *Policy) Version() int64 { return p.version }

// Hash is the hex SHA-256 of the canonical encoding of the content.
func (p *Policy) Hash() string { return p.hash }

// WithVersion returns a copy of the policy that carries version v.
func (p *Policy) WithVersion(v int64) *Policy {
	c := *p
	c.version = v
	return &c
}

// Spec returns the compiled content. Its slices are shared: do not modify them.
func (p *Policy) Spec() *Spec { return &p.spec }

// Plane is the QuotaPlane's name.
func (p *Policy) Plane() string { return p.spec.Plane }

// ID names the plane across namespaces, "namespace/name": its Redis keys
// carry it (the enforcer's state, and the policy store's plane).
func (p *Policy) ID() string { return p.spec.Namespace + "/" + p.spec.Plane }

// Global is the plane's global limit.
func (p *Policy) Global() Limit { return p.spec.Global }

// Tier returns the named tier.
func (p *Policy) Tier(name string) (Tier, bool) {
	i, ok := p.tierIndex[name]
	if !ok {
		return Tier{}, false
	}
	return p.spec.Tiers[i], true
}

// PriorityBase is the base score, 0 to 1, of the named tier in seed 004's
// priority score: its priorityBase, or DefaultPriorityBase for its rank.
// A name that is not a tier of the plane gets the default tier's, as
// DefaultTenant gives such a tenant the default tier. A tenant the plane
// does not name has no other signal: its score is its tier's base (and its
// usage).
func (p *Policy) PriorityBase(tier string) float64 {
	i, ok := p.tierIndex[tier]
	if !ok {
		i = p.tierIndex[p.spec.DefaultTier]
	}
	return p.priorityBase[i]
}

// Endpoints returns the plane's endpoints sorted by name; an endpoint's index
// in this slice is stable for the life of the policy.
func (p *Policy) Endpoints() []Endpoint { return p.spec.Endpoints }

// EndpointIndex returns the index of the named endpoint in Endpoints.
func (p *Policy) EndpointIndex(name string) (int, bool) {
	i, ok := p.endpointIndex[name]
	return i, ok
}

// Tenant returns a tenant the plane names.
func (p *Policy) Tenant(name string) (Tenant, bool) {
	i, ok := p.tenantIndex[name]
	if !ok {
		return Tenant{}, false
	}
	return p.spec.Tenants[i], true
}

// DefaultTenant returns the effective limits of a tenant the plane does not
// name: those of tier when it names a tier of the plane, else of the default
// tier. ok is false when the plane denies unknown tenants.
func (p *Policy) DefaultTenant(name, tier string) (t Tenant, ok bool) {
	if p.spec.UnknownTenants == "deny" {
		return Tenant{}, false
	}
	tr, found := p.Tier(tier)
	if !found {
		tr, _ = p.Tier(p.spec.DefaultTier)
	}
	return Tenant{Name: name, Tier: tr.Name, Limit: tr.Tenant, Weight: tr.Weight, Hard: tr.Hard}, true
}

// EndpointLimit resolves the limit on endpoint ep for tenant t: the tenant's own
// override, else the endpoint's limit for the tenant's tier, else the
// endpoint's default limit; nil means no endpoint limit.
func (p *Policy) EndpointLimit(t *Tenant, ep int) *Limit {
	e := &p.spec.Endpoints[ep]
	for i := range t.Endpoints {
		if t.Endpoints[i].Endpoint == e.Name {
			return &t.Endpoints[i].Limit
		}
	}
	for i := range e.Tiers {
		if e.Tiers[i].Tier == t.Tier {
			return &e.Tiers[i].Limit
		}
	}
	return e.Limit
}

// KeyLimit resolves the limit on api key key of tenant t: the tenant's override
// for that key, else its tier's key limit; nil means no key limit.
func (p *Policy) KeyLimit(t *Tenant, key string) *Limit {
	if i, ok := t.keyIndex(key); ok {
		return &t.Keys[i].Limit
	}
	if tr, ok := p.Tier(t.Tier); ok {
		return tr.Key
	}
	return nil
}

// NamesKey reports whether tenant t's own overrides name api key key.
func (p *Policy) NamesKey(t *Tenant, key string) bool {
	_, ok := t.keyIndex(key)
	return ok
}

// keyIndex finds key among the tenant's overrides, which are sorted by key.
func (t *Tenant) keyIndex(key string) (int, bool) {
	return slices.BinarySearchFunc(t.Keys, key, func(k KeyLimit, key string) int { return strings.Compare(k.Key, key) })
}

// MayBorrow says whether tenant t may borrow from the burst pool: there is a
// pool, the tenant is soft, and the pool admits its tier.
func (p *Policy) MayBorrow(t *Tenant) bool {
	if p.spec.BurstPool == nil || t.Hard {
		return false
	}
	return len(p.spec.BurstPool.Tiers) == 0 || p.mayBorrowTier[t.Tier]
}

// Encode returns the canonical encoding of the policy: its version, hash and
// content. Decode reverses it.
func (p *Policy) Encode() []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, `{"version":%d,"hash":%q,"spec":`, p.version, p.hash)
	b.Write(p.encoded)
	b.WriteByte('}')
	return b.Bytes()
}

// EncodedSpec returns the canonical encoding of the content alone, the bytes
// the hash covers.
func (p *Policy) EncodedSpec() []byte { return slices.Clone(p.encoded) }

type envelope struct {
	Version int64           `json:"version"`
	Hash    string          `json:"hash"`
	Spec    json.RawMessage `json:"spec"`
}

// Decode parses an encoding made by Encode, checks its hash and revalidates
// the content, so a corrupt or hand-edited blob is never loaded.
func Decode(data []byte) (*Policy, error) {
	var env envelope
	envDec := json.NewDecoder(bytes.NewReader(data))
	envDec.DisallowUnknownFields()
	if err := envDec.Decode(&env); err != nil {
		return nil, fmt.Errorf("decode policy: %w", err)
	}
	if _, err := envDec.Token(); err != io.EOF {
		return nil, fmt.Errorf("decode policy: data after the policy")
	}
	var spec Spec
	dec := json.NewDecoder(bytes.NewReader(env.Spec))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&spec); err != nil {
		return nil, fmt.Errorf("decode policy spec: %w", err)
	}
	p, err := newPolicy(spec)
	if err != nil {
		return nil, fmt.Errorf("decode policy: %w", err)
	}
	if env.Hash != p.hash {
		return nil, fmt.Errorf("decode policy: content hash %s does not match the recorded hash %s", p.hash, env.Hash)
	}
	p.version = env.Version
	return p, nil
}

// newPolicy builds the indexes and the canonical encoding of a spec that is
// already in canonical order, and checks the invariants the engine relies on.
func newPolicy(spec Spec) (*Policy, error) {
	if err := checkSpec(&spec); err != nil {
		return nil, err
	}
	enc, err := json.Marshal(&spec)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(enc)
	p := &Policy{
		hash:          hex.EncodeToString(sum[:]),
		spec:          spec,
		encoded:       enc,
		tierIndex:     make(map[string]int, len(spec.Tiers)),
		endpointIndex: make(map[string]int, len(spec.Endpoints)),
		tenantIndex:   make(map[string]int, len(spec.Tenants)),
	}
	p.priorityBase = make([]float64, len(spec.Tiers))
	for i, t := range spec.Tiers {
		p.tierIndex[t.Name] = i
		p.priorityBase[i] = DefaultPriorityBase(i, len(spec.Tiers))
		if t.PriorityBase != nil {
			p.priorityBase[i] = float64(*t.PriorityBase) / 100
		}
	}
	p.endpointFold = make(map[string]int, len(spec.Endpoints))
	for i, e := range spec.Endpoints {
		p.endpointIndex[e.Name] = i
		p.endpointFold[strings.ToLower(e.Name)] = i
		for _, m := range e.Match {
			cm := compiledMatch{Match: m, endpoint: i, methods: m.Methods}
			if m.Type == PathPattern {
				cm.segments = strings.Split(m.Path[1:], "/")
			}
			p.matches = append(p.matches, cm)
		}
	}
	slices.SortStableFunc(p.matches, func(a, b compiledMatch) int { return a.compare(&b) })
	p.keyOwner = map[[32]byte]int{}
	for i, t := range spec.Tenants {
		p.spec.Tenants[i].Known = true
		p.tenantIndex[t.Name] = i
		for _, h := range t.KeyHashes {
			var sum [32]byte
			_, _ = hex.Decode(sum[:], []byte(h[len(KeyHashPrefix):])) // checkSpec checked the form
			p.keyOwner[sum] = i
		}
	}
	if bp := spec.BurstPool; bp != nil {
		p.mayBorrowTier = make(map[string]bool, len(bp.Tiers))
		for _, t := range bp.Tiers {
			p.mayBorrowTier[t] = true
		}
	}
	return p, nil
}

// checkSpec verifies what the engine relies on, for specs that did not come
// from Compile (Decode): canonical order, known references, limits in range.
func checkSpec(s *Spec) error {
	if len(s.Tiers) == 0 || len(s.Tiers) > MaxTiers {
		return fmt.Errorf("spec has %d tiers; a plane has 1 to %d", len(s.Tiers), MaxTiers)
	}
	tiers := map[string]bool{}
	var floors int64
	for i, t := range s.Tiers {
		if tiers[t.Name] {
			return fmt.Errorf("tier %s is defined twice", t.Name)
		}
		if !ValidTierName(t.Name) {
			return fmt.Errorf("tier name %q is not valid", t.Name)
		}
		tiers[t.Name] = true
		if t.Weight < 1 || t.Weight > 1_000_000 || t.FloorPercent < 0 || t.FloorPercent > 100 {
			return fmt.Errorf("tier %s: weight %d or floorPercent %d out of range", t.Name, t.Weight, t.FloorPercent)
		}
		floors += t.FloorPercent
		if i > 0 {
			if prev := s.Tiers[i-1]; t.Weight > prev.Weight || t.Weight == prev.Weight && t.Name < prev.Name {
				return fmt.Errorf("tiers must be in priority order (weight descending, then name)")
			}
		}
		if err := checkLimits([]*Limit{t.Tenant, t.Key}); err != nil {
			return fmt.Errorf("tier %s: %w", t.Name, err)
		}
		if b := t.PriorityBase; b != nil && (*b < 0 || *b > MaxPriorityPercent || isDefaultPriorityBase(*b, i, len(s.Tiers))) {
			return fmt.Errorf("tier %s: priorityBase %d out of range [0, %d], or its rank's default (which is left unset)", t.Name, *b, MaxPriorityPercent)
		}
	}
	if floors > 100 {
		return fmt.Errorf("tier floors add up to %d%%, more than 100%%", floors)
	}
	if !tiers[s.DefaultTier] {
		return fmt.Errorf("default tier %q is not a tier", s.DefaultTier)
	}
	if err := s.Global.check(); err != nil {
		return fmt.Errorf("global: %w", err)
	}
	if s.Global.Algorithm != TokenBucket {
		return fmt.Errorf("global: must be a tokenBucket")
	}
	for _, f := range []struct {
		name, value string
		allowed     []string
	}{
		{"mode", s.Mode, Modes}, {"fairness", s.Fairness, FairnessModes}, {"failureMode", s.FailureMode, FailureModes},
		{"shareBy (the default, tenant, stored empty)", s.ShareBy, []string{"", ShareByTier}},
		{"unknownTenants", s.UnknownTenants, UnknownPolicies}, {"unknownEndpoints", s.UnknownEndpoints, UnknownPolicies},
	} {
		if !slices.Contains(f.allowed, f.value) {
			return fmt.Errorf("%s %q is not one of %v", f.name, f.value, f.allowed)
		}
	}
	if s.ReconcileInterval < MinReconcileInterval || s.ReconcileInterval > time.Hour {
		return fmt.Errorf("reconcileInterval %s out of range", s.ReconcileInterval)
	}
	if s.Shards < 1 || s.Shards > MaxShards {
		return fmt.Errorf("shards %d out of range [1, %d]", s.Shards, MaxShards)
	}
	for _, t := range s.Tenants {
		if t.Shards < 0 || t.Shards == 1 || t.Shards > s.Shards {
			return fmt.Errorf("tenant %s: shards %d out of range (0, or 2 to the plane's %d)", t.Name, t.Shards, s.Shards)
		}
	}
	if !sortedUnique(s.Endpoints, func(e Endpoint) string { return e.Name }) ||
		!sortedUnique(s.Tenants, func(t Tenant) string { return t.Name }) {
		return fmt.Errorf("endpoints and tenants must be sorted by name, without duplicates")
	}
	if !slices.Contains(KeyBindings, s.KeyBinding) {
		return fmt.Errorf("keyBinding %q is not one of %v", s.KeyBinding, KeyBindings)
	}
	for _, keys := range [][]string{s.Descriptors.Tenant, s.Descriptors.Endpoint, s.Descriptors.APIKey} {
		if problem := checkEntryKeys(keys); problem != "" {
			return fmt.Errorf("descriptors: %s", problem)
		}
	}
	if problem := checkEntryKeys(slices.Concat(s.Descriptors.Tenant, s.Descriptors.Endpoint, s.Descriptors.APIKey)); problem != "" {
		return fmt.Errorf("descriptors: an entry key names two of tenant, endpoint and api key")
	}
	folded := map[string]bool{}
	for _, e := range s.Endpoints {
		if folded[strings.ToLower(e.Name)] {
			return fmt.Errorf("endpoint %s: another endpoint differs from it only in case", e.Name)
		}
		folded[strings.ToLower(e.Name)] = true
		if len(e.Match) > MaxMatches {
			return fmt.Errorf("endpoint %s: more than %d matches", e.Name, MaxMatches)
		}
		for _, m := range e.Match {
			if _, ok := pathTypeRank[m.Type]; !ok {
				return fmt.Errorf("endpoint %s: match type %q is not one of Exact, PathPrefix, Pattern", e.Name, m.Type)
			}
			if problem := checkMatchPath(m.Type, m.Path); problem != "" {
				return fmt.Errorf("endpoint %s: match: %s", e.Name, problem)
			}
			for _, method := range m.Methods {
				if !slices.Contains(httpMethods, method) {
					return fmt.Errorf("endpoint %s: match: %q is not an HTTP method", e.Name, method)
				}
			}
			if !sortedUnique(m.Methods, func(s string) string { return s }) {
				return fmt.Errorf("endpoint %s: match methods must be sorted, without duplicates", e.Name)
			}
		}
	}
	owners := map[string]bool{}
	for _, t := range s.Tenants {
		if len(t.KeyHashes) > MaxKeyHashes+MaxSecretKeys || !sortedUnique(t.KeyHashes, func(s string) string { return s }) {
			return fmt.Errorf("tenant %s: key hashes must be sorted, without duplicates, at most %d", t.Name, MaxKeyHashes+MaxSecretKeys)
		}
		for _, h := range t.KeyHashes {
			if !ValidKeyHash(h) {
				return fmt.Errorf("tenant %s: key hash %q is not sha256: and 64 hex digits", t.Name, h)
			}
			if owners[h] {
				return fmt.Errorf("tenant %s: an api key belongs to two tenants", t.Name)
			}
			owners[h] = true
		}
	}
	for _, e := range s.Endpoints {
		if !ValidEndpointName(e.Name) {
			return fmt.Errorf("endpoint name %q is not valid", e.Name)
		}
		if e.Cost < 1 || e.Cost > MaxCost {
			return fmt.Errorf("endpoint %s: cost %d out of range", e.Name, e.Cost)
		}
		limits := []*Limit{e.Limit}
		for i := range e.Tiers {
			limits = append(limits, &e.Tiers[i].Limit)
		}
		if err := checkLimits(limits); err != nil {
			return fmt.Errorf("endpoint %s: %w", e.Name, err)
		}
	}
	for _, t := range s.Tenants {
		limits := []*Limit{t.Limit}
		for i := range t.Keys {
			limits = append(limits, &t.Keys[i].Limit)
		}
		for i := range t.Endpoints {
			limits = append(limits, &t.Endpoints[i].Limit)
		}
		if err := checkLimits(limits); err != nil {
			return fmt.Errorf("tenant %s: %w", t.Name, err)
		}
		if !tiers[t.Tier] {
			return fmt.Errorf("tenant %s: tier %q is not a tier", t.Name, t.Tier)
		}
		if t.Weight < 1 || t.Weight > MaxWeight {
			return fmt.Errorf("tenant %s: weight %d < 1 or > %d", t.Name, t.Weight, MaxWeight)
		}
		if !ValidName(t.Name) {
			return fmt.Errorf("tenant name %q is not valid", t.Name)
		}
		if pr := t.Priority; pr != nil && (*pr == Priority{} || pr.ContractValue < 0 || pr.ContractValue > MaxContractValue || pr.Importance < 0 || pr.Importance > MaxPriorityPercent) {
			return fmt.Errorf("tenant %s: priority %+v empty (which is left unset) or out of range", t.Name, *pr)
		}
		for _, k := range t.Keys {
			if !ValidName(k.Key) {
				return fmt.Errorf("tenant %s: api key %q is not valid", t.Name, k.Key)
			}
		}
		if !sortedUnique(t.Keys, func(k KeyLimit) string { return k.Key }) {
			return fmt.Errorf("tenant %s: keys must be sorted, without duplicates", t.Name)
		}
	}
	if bp := s.BurstPool; bp != nil && (bp.Size < 1 || bp.Size > MaxRate || bp.RefillRate < 0 || bp.RefillRate > MaxRate || bp.PerTenantCeiling < 1 || bp.PerTenantCeiling > bp.Size) {
		return fmt.Errorf("burst pool %+v out of range", *bp)
	}
	return nil
}

func checkLimits(limits []*Limit) error {
	for _, l := range limits {
		if l != nil {
			if err := l.check(); err != nil {
				return err
			}
		}
	}
	return nil
}

// check verifies the ranges documented on the constants above.
func (l Limit) check() error {
	switch {
	case l.Algorithm != TokenBucket && l.Algorithm != SlidingWindow:
		return fmt.Errorf("unknown algorithm %q", l.Algorithm)
	case l.Rate < 0 || l.Rate > MaxRate:
		return fmt.Errorf("rate %d out of range [0, %d]", l.Rate, MaxRate)
	case l.Burst < 1 || l.Burst > MaxRate:
		return fmt.Errorf("burst %d out of range [1, %d]", l.Burst, MaxRate)
	case l.Period < MinPeriod || l.Period > MaxPeriod || l.Period%1000 != 0:
		return fmt.Errorf("period %s must be a whole number of microseconds in [%s, %s]", l.Period, MinPeriod, MaxPeriod)
	case l.Burst > MaxScaledLevel/l.PeriodMicros():
		return fmt.Errorf("burst %d × period %s is too large (at most 2^53 token·µs)", l.Burst, l.Period)
	case l.Algorithm == SlidingWindow && (l.Rate < 1 || l.Rate > MaxSlidingWindowRate):
		return fmt.Errorf("sliding window rate %d out of range [1, %d]", l.Rate, MaxSlidingWindowRate)
	}
	return nil
}

// sortedUnique reports whether s is strictly increasing by key: sorted, and
// no key twice (slices.IsSortedFunc would accept duplicates).
func sortedUnique[T any](s []T, key func(T) string) bool {
	for i := 1; i < len(s); i++ {
		if key(s[i-1]) >= key(s[i]) {
			return false
		}
	}
	return true
}
