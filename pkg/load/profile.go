package load

import (
	"cmp"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"time"
)

// Tier names, in the order of seed 002's tier mix.
var Tiers = []string{"enterprise", "standard", "free"}

// Endpoint is one endpoint of the profile and its share of the requests.
// Its cost (1, 5, 50 in seed 002) lives in the plane's EndpointQuota; the
// generator only names it.
type Endpoint struct {
	Name  string
	Share float64
}

// Spike is a noisy neighbour: Tenant offers Rate more requests per second
// from From to To (times since the start of the run).
type Spike struct {
	Tenant   string
	Rate     float64
	From, To time.Duration
}

// Profile describes the offered load. Everything is derived from it and
// Seed, so two runs of one profile offer the same requests in the same order.
type Profile struct {
	Seed uint64
	// Tier mix: Enterprise, Standard and the rest free. The whales are
	// enterprise; the other tiers are spread over the rest by a seeded
	// shuffle.
	Tenants, Enterprise, Standard int
	// ZipfS skews the rate over tenants: the tenant of rank k (from 1)
	// offers ∝ k^-s. Rank 1..Whales are named whale-1..; the rest t-NNNNN.
	ZipfS  float64
	Whales int
	// KeysPerTenant api keys per tenant, chosen uniformly.
	KeysPerTenant int
	Endpoints     []Endpoint
	// Rate is the offered aggregate (requests per second) without spikes.
	Rate     float64
	Duration time.Duration
	Spikes   []Spike
}

// Seed002 is the profile of seed 002 §4: 5,000 tenants (50 enterprise, 950
// standard, 4,000 free), Zipf s = 1.2 with 20 whales, 4 keys each, and
// read/write/export in a 90/9/1 mix.
func Seed002() Profile {
	return Profile{
		Seed: 1, Tenants: 5000, Enterprise: 50, Standard: 950,
		ZipfS: 1.2, Whales: 20, KeysPerTenant: 4,
		Endpoints: []Endpoint{{"read", 0.90}, {"write", 0.09}, {"export", 0.01}},
		Rate:      100_000, Duration: 10 * time.Second,
	}
}

// Tenant is one tenant of a built profile.
type Tenant struct {
	Name string
	Tier string
	Rank int     // 1 = the heaviest
	Rate float64 // its offered requests per second without spikes
	keys []string
}

// Keys are the tenant's api keys.
func (t *Tenant) Keys() []string { return t.keys }

// Built is a profile made concrete: its tenants (by rank) and samplers.
type Built struct {
	Profile
	Tenants []Tenant
	index   map[string]int
	tenant  alias // draws a tenant index by rate
	cum     []float64
}

// Build checks p and makes its tenants.
func (p Profile) Build() (*Built, error) {
	switch {
	case p.Tenants < 1:
		return nil, fmt.Errorf("load: %d tenants: need at least 1", p.Tenants)
	case p.Enterprise < 0 || p.Standard < 0 || p.Enterprise+p.Standard > p.Tenants:
		return nil, fmt.Errorf("load: %d enterprise + %d standard tenants do not fit in %d", p.Enterprise, p.Standard, p.Tenants)
	case p.ZipfS < 0:
		return nil, fmt.Errorf("load: zipf s %g: it must be at least 0", p.ZipfS)
	case p.Whales < 0 || p.Whales > p.Tenants:
		return nil, fmt.Errorf("load: %d whales of %d tenants", p.Whales, p.Tenants)
	case p.KeysPerTenant < 1:
		return nil, fmt.Errorf("load: %d keys per tenant: need at least 1", p.KeysPerTenant)
	case len(p.Endpoints) == 0:
		return nil, fmt.Errorf("load: no endpoints")
	case p.Rate < 0 || math.IsNaN(p.Rate) || math.IsInf(p.Rate, 0):
		return nil, fmt.Errorf("load: rate %g: it must be a finite number ≥ 0", p.Rate)
	case p.Duration <= 0:
		return nil, fmt.Errorf("load: duration %s: it must be positive", p.Duration)
	}
	b, err := p.newBuilt()
	if err != nil {
		return nil, err
	}
	b.Tenants = make([]Tenant, p.Tenants)
	rng := rand.New(rand.NewPCG(p.Seed, 0x5eed))
	tierOf := make([]string, p.Tenants)
	// Whales are enterprise customers (as far as there are enough); the
	// other tiers are shuffled over the rest.
	whalesEnt := min(p.Whales, p.Enterprise)
	for i := range whalesEnt {
		tierOf[i] = Tiers[0]
	}
	rest := tierOf[whalesEnt:]
	copy(rest, slices.Concat(slices.Repeat([]string{Tiers[0]}, p.Enterprise-whalesEnt),
		slices.Repeat([]string{Tiers[1]}, p.Standard), slices.Repeat([]string{Tiers[2]}, p.Tenants-p.Enterprise-p.Standard)))
	rng.Shuffle(len(rest), func(i, j int) { rest[i], rest[j] = rest[j], rest[i] })
	var norm float64
	for k := 1; k <= p.Tenants; k++ {
		norm += math.Pow(float64(k), -p.ZipfS)
	}
	weights := make([]float64, p.Tenants)
	for i := range b.Tenants {
		rank := i + 1
		name := fmt.Sprintf("t-%05d", rank)
		if rank <= p.Whales {
			name = fmt.Sprintf("whale-%d", rank)
		}
		weights[i] = math.Pow(float64(rank), -p.ZipfS) / norm
		t := Tenant{Name: name, Tier: tierOf[i], Rank: rank, Rate: p.Rate * weights[i], keys: make([]string, p.KeysPerTenant)}
		for k := range t.keys {
			t.keys[k] = fmt.Sprintf("%s-key-%d", name, k)
		}
		b.Tenants[i] = t
		b.index[name] = i
	}
	for _, s := range p.Spikes {
		if _, ok := b.index[s.Tenant]; !ok {
			return nil, fmt.Errorf("load: spike of tenant %q: no such tenant (names are whale-1..whale-%d and t-NNNNN)", s.Tenant, p.Whales)
		}
		if s.Rate < 0 || s.To < s.From {
			return nil, fmt.Errorf("load: spike of %s: rate %g from %s to %s", s.Tenant, s.Rate, s.From, s.To)
		}
	}
	b.tenant = newAlias(weights)
	return b, nil
}

// newBuilt checks p's endpoints and makes its endpoint sampler, for Build
// and BuildTenants.
func (p Profile) newBuilt() (*Built, error) {
	var shares float64
	for _, e := range p.Endpoints {
		if e.Name == "" || e.Share < 0 {
			return nil, fmt.Errorf("load: endpoint %q with share %g", e.Name, e.Share)
		}
		shares += e.Share
	}
	if shares <= 0 {
		return nil, fmt.Errorf("load: the endpoint shares add up to %g", shares)
	}
	b := &Built{Profile: p, index: make(map[string]int, p.Tenants), cum: make([]float64, len(p.Endpoints))}
	var c float64
	for i, e := range p.Endpoints {
		c += e.Share / shares
		b.cum[i] = c
	}
	return b, nil
}

// TenantRate is one tenant of a recorded profile (BuildTenants).
type TenantRate struct {
	Name string
	// Tier is sent with the tenant's requests: the tier of a tenant the
	// plane does not name (empty: the plane's default tier).
	Tier string
	// Rate is the requests per second the tenant offers.
	Rate float64
}

// BuildTenants makes a profile of the tenants given, a recorded load,
// instead of p's Zipf mix: it takes p's Seed, KeysPerTenant, Endpoints,
// Duration and Spikes, and ignores its tier mix, ZipfS, Whales and Rate.
// Ranks follow the rates, the heaviest first (ties in the order given);
// the offered aggregate is their sum.
func (p Profile) BuildTenants(ts []TenantRate) (*Built, error) {
	switch {
	case len(ts) == 0:
		return nil, fmt.Errorf("load: no tenants")
	case p.KeysPerTenant < 1:
		return nil, fmt.Errorf("load: %d keys per tenant: need at least 1", p.KeysPerTenant)
	case p.Duration <= 0:
		return nil, fmt.Errorf("load: duration %s: it must be positive", p.Duration)
	}
	ts = slices.Clone(ts)
	slices.SortStableFunc(ts, func(a, b TenantRate) int { return cmp.Compare(b.Rate, a.Rate) })
	p.Tenants, p.Enterprise, p.Standard, p.ZipfS, p.Whales, p.Rate = len(ts), 0, 0, 0, 0, 0
	weights := make([]float64, len(ts))
	for i, t := range ts {
		if t.Name == "" || t.Rate < 0 || math.IsNaN(t.Rate) || math.IsInf(t.Rate, 0) {
			return nil, fmt.Errorf("load: tenant %q at %g requests/s: it needs a name and a finite rate ≥ 0", t.Name, t.Rate)
		}
		p.Rate += t.Rate
		weights[i] = t.Rate
	}
	if p.Rate <= 0 {
		return nil, fmt.Errorf("load: the tenants offer nothing: their rates add up to 0")
	}
	b, err := p.newBuilt()
	if err != nil {
		return nil, err
	}
	b.Tenants = make([]Tenant, len(ts))
	for i, t := range ts {
		if _, dup := b.index[t.Name]; dup {
			return nil, fmt.Errorf("load: tenant %q is listed twice", t.Name)
		}
		b.Tenants[i] = Tenant{Name: t.Name, Tier: t.Tier, Rank: i + 1, Rate: t.Rate, keys: make([]string, p.KeysPerTenant)}
		for k := range b.Tenants[i].keys {
			b.Tenants[i].keys[k] = fmt.Sprintf("%s-key-%d", t.Name, k)
		}
		b.index[t.Name] = i
	}
	for _, s := range p.Spikes {
		if _, ok := b.index[s.Tenant]; !ok || s.Rate < 0 || s.To < s.From {
			return nil, fmt.Errorf("load: spike of %s: rate %g from %s to %s (a listed tenant, rate ≥ 0, from ≤ to)", s.Tenant, s.Rate, s.From, s.To)
		}
	}
	b.tenant = newAlias(weights)
	return b, nil
}

// Index is the rank-1 index of the named tenant.
func (b *Built) Index(name string) (int, bool) {
	i, ok := b.index[name]
	return i, ok
}

// WhaleShare is the fraction of the offered rate the whales carry.
func (b *Built) WhaleShare() float64 {
	var w float64
	for _, t := range b.Tenants[:b.Whales] {
		w += t.Rate
	}
	return w / b.Rate
}

// Summary describes the built profile in one line.
func (b *Built) Summary() string {
	counts := map[string]int{}
	for _, t := range b.Tenants {
		counts[t.Tier]++
	}
	var eps []string
	for _, e := range b.Endpoints {
		eps = append(eps, fmt.Sprintf("%s %.0f%%", e.Name, 100*e.Share))
	}
	tail := 0
	for _, t := range b.Tenants[min(b.Whales, len(b.Tenants)):] {
		if t.Rate < 5 {
			tail++
		}
	}
	return fmt.Sprintf("%d tenants (%d enterprise, %d standard, %d free), zipf s=%.2f: %d whales carry %.0f%%, %d tenants offer < 5/s; %d keys each; %s; %.0f req/s for %s",
		len(b.Tenants), counts[Tiers[0]], counts[Tiers[1]], counts[Tiers[2]], b.ZipfS, b.Whales, 100*b.WhaleShare(), tail,
		b.KeysPerTenant, strings.Join(eps, ", "), b.Rate, b.Duration)
}

// endpoint draws an endpoint index for u in [0,1).
func (b *Built) endpoint(u float64) int {
	i, _ := slices.BinarySearch(b.cum, u)
	return min(i, len(b.cum)-1)
}

// alias is Vose's alias table: O(1) draws from a discrete distribution.
type alias struct {
	prob  []float64
	alias []int32
}

func newAlias(weights []float64) alias {
	n := len(weights)
	var sum float64
	for _, w := range weights {
		sum += w
	}
	a := alias{prob: make([]float64, n), alias: make([]int32, n)}
	scaled := make([]float64, n)
	var small, large []int
	for i, w := range weights {
		scaled[i] = w * float64(n) / sum
		if scaled[i] < 1 {
			small = append(small, i)
		} else {
			large = append(large, i)
		}
	}
	for len(small) > 0 && len(large) > 0 {
		s, l := small[len(small)-1], large[len(large)-1]
		small = small[:len(small)-1]
		a.prob[s], a.alias[s] = scaled[s], int32(l)
		scaled[l] -= 1 - scaled[s]
		if scaled[l] < 1 {
			large = large[:len(large)-1]
			small = append(small, l)
		}
	}
	for _, i := range append(small, large...) {
		a.prob[i], a.alias[i] = 1, int32(i)
	}
	return a
}

func (a *alias) draw(rng *rand.Rand) int {
	i := rng.IntN(len(a.prob))
	if rng.Float64() < a.prob[i] {
		return i
	}
	return int(a.alias[i])
}
