package policy

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/quotaplane/quotaplane/api/v1alpha1"
)

// Defaults applied by Compile where a field is unset.
const (
	DefaultPeriod            = time.Second
	DefaultReconcileInterval = 200 * time.Millisecond
	MinReconcileInterval     = 10 * time.Millisecond
	DefaultMaxReplicas       = 10
	// MaxReplicas bounds a plane's enforcer fleet (the manager caps it
	// further).
	MaxReplicas = 1000
)

// Problem is one thing wrong with one object: which object, which field, and
// what to do about it.
type Problem struct {
	Kind      string
	Namespace string
	Name      string
	// Field is the path of the offending field, such as "spec.tiers[1].weight";
	// empty when the problem is the object as a whole.
	Field   string
	Message string
}

// Object names the object: "TenantQuota team-a/acme".
func (p Problem) Object() string {
	switch {
	case p.Name == "" && p.Namespace == "":
		return p.Kind
	case p.Name == "":
		return p.Kind + " in namespace " + p.Namespace
	case p.Namespace == "":
		return p.Kind + " " + p.Name
	}
	return p.Kind + " " + p.Namespace + "/" + p.Name
}

func (p Problem) String() string {
	if p.Field == "" {
		return p.Object() + ": " + p.Message
	}
	return p.Object() + ": " + p.Field + ": " + p.Message
}

// Error makes a Problem usable as an error.
func (p Problem) Error() string { return p.String() }

// problems collects problems for one object and remembers whether any was found.
type problems struct {
	kind, namespace, name string
	list                  *[]Problem
	found                 bool
}

func (ps *problems) add(field, format string, args ...any) {
	ps.found = true
	*ps.list = append(*ps.list, Problem{Kind: ps.kind, Namespace: ps.namespace, Name: ps.name, Field: field, Message: fmt.Sprintf(format, args...)})
}

func newProblems(list *[]Problem, kind string, meta metav1.Object) *problems {
	return &problems{kind: kind, namespace: meta.GetNamespace(), name: meta.GetName(), list: list}
}

// Compile compiles the objects of one plane (one namespace) into a Policy.
//
// Objects with problems are left out and reported; the policy is nil only when
// the plane as a whole cannot be compiled (see the package doc). The result
// does not depend on the order of objs.
func Compile(objs []runtime.Object) (*Policy, []Problem) {
	var (
		list      []Problem
		planes    []*v1alpha1.QuotaPlane
		tenants   []*v1alpha1.TenantQuota
		endpoints []*v1alpha1.EndpointQuota
		pools     []*v1alpha1.BurstPool
		upstreams []*v1alpha1.Upstream
		secrets   = map[string]*corev1.Secret{} // by namespace/name
	)
	// Two objects with the same kind, namespace and name cannot both be
	// meant (the API server never holds them; files can): both are left out.
	identity := func(o runtime.Object) string {
		if m, ok := o.(metav1.Object); ok {
			return fmt.Sprintf("%T %s/%s", o, m.GetNamespace(), m.GetName())
		}
		return ""
	}
	seen := map[string]int{}
	for _, o := range objs {
		seen[identity(o)]++
	}
	for _, o := range objs {
		if id := identity(o); id != "" && seen[id] > 1 {
			m := o.(metav1.Object)
			kind := strings.TrimPrefix(fmt.Sprintf("%T", o), "*v1alpha1.")
			list = append(list, Problem{Kind: kind, Namespace: m.GetNamespace(), Name: m.GetName(),
				Message: fmt.Sprintf("defined %d times; keep one object of each name", seen[id])})
			continue
		}
		switch o := o.(type) {
		case *v1alpha1.QuotaPlane:
			planes = append(planes, o)
		case *v1alpha1.TenantQuota:
			tenants = append(tenants, o)
		case *v1alpha1.EndpointQuota:
			endpoints = append(endpoints, o)
		case *v1alpha1.BurstPool:
			pools = append(pools, o)
		case *v1alpha1.Upstream:
			upstreams = append(upstreams, o)
		case *corev1.Secret:
			secrets[o.Namespace+"/"+o.Name] = o // read only through a TenantQuota's keySecretRef
		default:
			list = append(list, Problem{Kind: fmt.Sprintf("%T", o), Message: "not a quotaplane.io/v1alpha1 kind; only QuotaPlane, TenantQuota, EndpointQuota, BurstPool and Upstream belong to a plane (and the Secrets TenantQuotas name)"})
		}
	}
	byName := func(a, b metav1.Object) int {
		return cmp.Or(cmp.Compare(a.GetNamespace(), b.GetNamespace()), cmp.Compare(a.GetName(), b.GetName()))
	}
	slices.SortFunc(planes, func(a, b *v1alpha1.QuotaPlane) int { return byName(a, b) })

	switch len(planes) {
	case 0:
		ns := "" // the first namespace, so that the problem does not depend on the order
		for _, o := range objs {
			if m, ok := o.(metav1.Object); ok && (ns == "" || m.GetNamespace() < ns) {
				ns = m.GetNamespace()
			}
		}
		list = append(list, Problem{Kind: "QuotaPlane", Namespace: ns, Message: "the plane has no QuotaPlane; create one that sets the global limit and the tiers"})
		return nil, sortProblems(list)
	case 1:
	default:
		names := make([]string, len(planes))
		for i, p := range planes {
			names[i] = p.Namespace + "/" + p.Name
		}
		for _, p := range planes {
			newProblems(&list, "QuotaPlane", p).add("", "found %d QuotaPlanes (%s); a namespace holds exactly one plane: delete all but one", len(planes), strings.Join(names, ", "))
		}
		return nil, sortProblems(list)
	}

	plane := planes[0]
	spec, ok := compilePlane(plane, &list)
	if !ok {
		return nil, sortProblems(list)
	}
	inPlane := func(kind string, o metav1.Object) bool {
		if o.GetNamespace() == plane.Namespace {
			return true
		}
		newProblems(&list, kind, o).add("metadata.namespace", "object is in namespace %q but the plane %s is in %q; all objects of a plane live in its namespace", o.GetNamespace(), plane.Name, plane.Namespace)
		return false
	}

	tiers := map[string]Tier{}
	for _, t := range spec.Tiers {
		tiers[t.Name] = t
	}

	// Endpoints first: tenant overrides refer to them.
	slices.SortFunc(endpoints, func(a, b *v1alpha1.EndpointQuota) int {
		return cmp.Or(cmp.Compare(a.Spec.Endpoint, b.Spec.Endpoint), byName(a, b))
	})
	owner := map[string]string{}
	folded := map[string]string{} // lower-case endpoint name → its name
	for _, eq := range endpoints {
		if !inPlane("EndpointQuota", eq) {
			continue
		}
		ps := newProblems(&list, "EndpointQuota", eq)
		if first, dup := owner[eq.Spec.Endpoint]; dup {
			ps.add("spec.endpoint", "endpoint %q is already defined by EndpointQuota %s; merge the two objects or rename this endpoint", eq.Spec.Endpoint, first)
			continue
		}
		if other, dup := folded[strings.ToLower(eq.Spec.Endpoint)]; dup {
			ps.add("spec.endpoint", "endpoint %q differs from endpoint %q only in case; names from the wire resolve without case, so rename one", eq.Spec.Endpoint, other)
			continue
		}
		if e, ok := compileEndpoint(eq, tiers, ps); ok {
			owner[e.Name] = eq.Name
			folded[strings.ToLower(e.Name)] = e.Name
			spec.Endpoints = append(spec.Endpoints, e)
		}
	}
	endpointNames := map[string]bool{}
	for _, e := range spec.Endpoints {
		endpointNames[e.Name] = true
	}

	slices.SortFunc(tenants, func(a, b *v1alpha1.TenantQuota) int {
		return cmp.Or(cmp.Compare(a.Spec.Tenant, b.Spec.Tenant), byName(a, b))
	})
	clear(owner)
	keyOwner := map[string]string{} // key hash → tenant
	for _, tq := range tenants {
		if !inPlane("TenantQuota", tq) {
			continue
		}
		ps := newProblems(&list, "TenantQuota", tq)
		if first, dup := owner[tq.Spec.Tenant]; dup {
			ps.add("spec.tenant", "tenant %q already has TenantQuota %s; merge the two objects (one TenantQuota per tenant)", tq.Spec.Tenant, first)
			continue
		}
		t, ok := compileTenant(tq, spec.DefaultTier, spec.Shards, tiers, endpointNames, ps)
		if ok {
			t.KeyHashes, ok = compileKeyHashes(tq, secrets, ps)
		}
		for _, h := range t.KeyHashes {
			if other, taken := keyOwner[h]; taken && ok {
				ps.add("spec.keyHashes", "api key %s… is also a key of tenant %q; an api key belongs to one tenant: remove it from one of them", h[:len(KeyHashPrefix)+12], other)
				ok = false
			}
		}
		if ok {
			owner[t.Name] = tq.Name
			for _, h := range t.KeyHashes {
				keyOwner[h] = t.Name
			}
			spec.Tenants = append(spec.Tenants, t)
		}
	}

	slices.SortFunc(pools, func(a, b *v1alpha1.BurstPool) int { return byName(a, b) })
	var poolOwner string
	for _, bp := range pools {
		if !inPlane("BurstPool", bp) {
			continue
		}
		ps := newProblems(&list, "BurstPool", bp)
		if spec.BurstPool != nil {
			ps.add("", "the plane already has BurstPool %s; a plane has at most one burst pool: delete this one or merge them", poolOwner)
			continue
		}
		if pool, ok := compilePool(bp, tiers, ps); ok {
			spec.BurstPool = &pool
			poolOwner = bp.Name
		}
	}

	p, err := newPolicy(spec)
	if err != nil {
		// Compile validated everything newPolicy checks; reaching this is a bug.
		newProblems(&list, "QuotaPlane", plane).add("", "internal error compiling the plane: %v", err)
		return nil, sortProblems(list)
	}
	// Upstreams are checked against the policy, not compiled into it
	// (CompileUpstreams): a problem is reported, the policy is the same.
	_, upstreamProblems := CompileUpstreams(p, upstreams)
	list = append(list, upstreamProblems...)
	return p, sortProblems(list)
}

func sortProblems(list []Problem) []Problem {
	slices.SortStableFunc(list, func(a, b Problem) int {
		return cmp.Or(cmp.Compare(a.Kind, b.Kind), cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name), cmp.Compare(a.Field, b.Field), cmp.Compare(a.Message, b.Message))
	})
	return list
}

func compilePlane(qp *v1alpha1.QuotaPlane, list *[]Problem) (Spec, bool) {
	ps := newProblems(list, "QuotaPlane", qp)
	s := qp.Spec
	spec := Spec{
		Namespace:         qp.Namespace,
		Plane:             qp.Name,
		Mode:              enum(ps, "spec.mode", string(s.Mode), Modes[0], Modes),
		Fairness:          enum(ps, "spec.fairness", string(s.Fairness), "maxmin", FairnessModes),
		ShareBy:           shareBy(enum(ps, "spec.shareBy", string(s.ShareBy), ShareByTenant, ShareByModes)),
		FailureMode:       enum(ps, "spec.failureMode", string(s.FailureMode), FailureModes[0], FailureModes),
		UnknownTenants:    enum(ps, "spec.unknownTenants", string(s.UnknownTenants), UnknownPolicies[0], UnknownPolicies),
		UnknownEndpoints:  enum(ps, "spec.unknownEndpoints", string(s.UnknownEndpoints), UnknownPolicies[0], UnknownPolicies),
		KeyBinding:        enum(ps, "spec.keyBinding", string(s.KeyBinding), KeyBindings[0], KeyBindings),
		Descriptors:       compileDescriptors(s.Descriptors, ps),
		ReconcileInterval: DefaultReconcileInterval,
		Shards:            max(int64(s.Shards), 1),
		Endpoints:         []Endpoint{},
		Tenants:           []Tenant{},
	}
	if ri := s.ReconcileInterval; ri != nil {
		if ri.Duration < MinReconcileInterval || ri.Duration > time.Hour {
			ps.add("spec.reconcileInterval", "%s is out of range; use a duration between %s and 1h (default %s)", ri.Duration, MinReconcileInterval, DefaultReconcileInterval)
		}
		spec.ReconcileInterval = ri.Duration
	}
	if s.Shards < 0 || s.Shards > MaxShards {
		ps.add("spec.shards", "%d is out of range; use 1 to %d", s.Shards, MaxShards)
	}
	spec.Global = compileLimit(s.Global, "spec.global", ps)
	if spec.Global.Algorithm == SlidingWindow {
		ps.add("spec.global.algorithm", "the global limit must be a tokenBucket: fairness and reconciliation work on its refill rate")
	}

	if len(s.Tiers) == 0 {
		ps.add("spec.tiers", "a plane needs at least one tier; add for example {name: standard, weight: 1}")
	}
	if len(s.Tiers) > MaxTiers {
		ps.add("spec.tiers", "a plane has at most %d tiers, not %d; merge some", MaxTiers, len(s.Tiers))
	}
	seen := map[string]bool{}
	var floors int64
	for i, t := range s.Tiers {
		field := fmt.Sprintf("spec.tiers[%d]", i)
		switch {
		case t.Name == "":
			ps.add(field+".name", "a tier needs a name")
		case !ValidTierName(t.Name):
			ps.add(field+".name", "%q is not a tier name; use a DNS label: lower-case letters, digits and '-', at most 63", t.Name)
		}
		if seen[t.Name] {
			ps.add(field+".name", "tier %q is defined twice; tier names must be unique", t.Name)
		}
		seen[t.Name] = true
		tier := Tier{Name: t.Name, Weight: t.Weight, FloorPercent: t.FloorPercent, Hard: t.Hard}
		if tier.Weight == 0 {
			tier.Weight = 1
		}
		if tier.Weight < 1 || tier.Weight > MaxWeight {
			ps.add(field+".weight", "weight %d is out of range; use 1 to 1000000", t.Weight)
		}
		if t.FloorPercent < 0 || t.FloorPercent > 100 {
			ps.add(field+".floorPercent", "floorPercent %d is out of range; use 0 to 100", t.FloorPercent)
		}
		floors += t.FloorPercent
		if t.Tenant != nil {
			l := compileLimit(*t.Tenant, field+".tenant", ps)
			tier.Tenant = &l
		}
		if t.Key != nil {
			l := compileLimit(*t.Key, field+".key", ps)
			tier.Key = &l
		}
		if b := t.PriorityBase; b != nil {
			if *b < 0 || *b > MaxPriorityPercent {
				ps.add(field+".priorityBase", "priorityBase %d is out of range; use 0 to %d (percent), or leave it unset for the default by rank", *b, MaxPriorityPercent)
			}
			base := *b
			tier.PriorityBase = &base
		}
		spec.Tiers = append(spec.Tiers, tier)
	}
	if floors > 100 {
		ps.add("spec.tiers", "tier floors add up to %d%%; they must add up to at most 100%% of the global limit: lower some floorPercent", floors)
	}
	slices.SortFunc(spec.Tiers, func(a, b Tier) int { return cmp.Or(cmp.Compare(b.Weight, a.Weight), cmp.Compare(a.Name, b.Name)) })
	for i := range spec.Tiers {
		// A base equal to its rank's default is the default: the canonical form.
		if b := spec.Tiers[i].PriorityBase; b != nil && isDefaultPriorityBase(*b, i, len(spec.Tiers)) {
			spec.Tiers[i].PriorityBase = nil
		}
	}
	switch {
	case s.DefaultTier != "":
		if !seen[s.DefaultTier] {
			ps.add("spec.defaultTier", "tier %q is not one of the plane's tiers (%s)", s.DefaultTier, tierNames(spec.Tiers))
		}
		spec.DefaultTier = s.DefaultTier
	case len(spec.Tiers) > 0:
		spec.DefaultTier = spec.Tiers[len(spec.Tiers)-1].Name // the least protected tier
	}

	if o := s.Outage; o != nil && o.Webhook != nil {
		// Read by the leader from the QuotaPlane itself, not compiled: the
		// enforcers never post notices.
		checkWebhook(o.Webhook, ps)
	}

	e := s.Enforcer
	spec.Enforcer = Enforcer{DeploymentName: e.DeploymentName, MinReplicas: e.MinReplicas, MaxReplicas: e.MaxReplicas, TargetRatePerReplica: e.TargetRatePerReplica}
	if spec.Enforcer.MinReplicas == 0 {
		spec.Enforcer.MinReplicas = 1
	}
	if spec.Enforcer.MaxReplicas == 0 {
		spec.Enforcer.MaxReplicas = max(DefaultMaxReplicas, spec.Enforcer.MinReplicas)
	}
	if spec.Enforcer.MinReplicas < 0 || spec.Enforcer.MaxReplicas < spec.Enforcer.MinReplicas {
		ps.add("spec.enforcer", "minReplicas %d and maxReplicas %d must satisfy 0 <= minReplicas <= maxReplicas", e.MinReplicas, e.MaxReplicas)
	}
	if e.MinReplicas > MaxReplicas || e.MaxReplicas > MaxReplicas {
		ps.add("spec.enforcer", "minReplicas %d and maxReplicas %d must be at most %d", e.MinReplicas, e.MaxReplicas, MaxReplicas)
	}
	if e.TargetRatePerReplica < 0 {
		ps.add("spec.enforcer.targetRatePerReplica", "must not be negative")
	}
	return spec, !ps.found
}

func tierNames(tiers []Tier) string {
	names := make([]string, len(tiers))
	for i, t := range tiers {
		names[i] = t.Name
	}
	return strings.Join(names, ", ")
}

// shareBy is how a Spec stores a plane's shareBy: the default, tenant, as
// empty (Spec.ShareBy).
func shareBy(s string) string {
	if s == ShareByTenant {
		return ""
	}
	return s
}

// enum returns value, or def when it is empty, and reports a value outside allowed.
func enum(ps *problems, field, value, def string, allowed []string) string {
	if value == "" {
		return def
	}
	if !slices.Contains(allowed, value) {
		ps.add(field, "%q is not valid; use one of %s", value, strings.Join(allowed, ", "))
	}
	return value
}

// compileLimit applies defaults and reports every out-of-range value.
func compileLimit(in v1alpha1.Limit, field string, ps *problems) Limit {
	l := Limit{Rate: in.Rate, Burst: in.Burst, Period: DefaultPeriod, Algorithm: TokenBucket}
	if in.Period != nil {
		l.Period = in.Period.Duration
	}
	switch in.Algorithm {
	case "", v1alpha1.TokenBucket:
	case v1alpha1.SlidingWindow:
		l.Algorithm = SlidingWindow
	default:
		ps.add(field+".algorithm", "%q is not an algorithm; use tokenBucket or slidingWindow", in.Algorithm)
	}
	if l.Burst == 0 || l.Algorithm == SlidingWindow {
		l.Burst = max(l.Rate, 1)
	}
	switch {
	case l.Rate < 0 || l.Rate > MaxRate:
		ps.add(field+".rate", "rate %d is out of range; use 0 to %d tokens per period (0 means no refill)", l.Rate, MaxRate)
	case l.Algorithm == SlidingWindow && (l.Rate < 1 || l.Rate > MaxSlidingWindowRate):
		ps.add(field+".rate", "a slidingWindow keeps one entry per request, so its rate must be 1 to %d; use tokenBucket for larger limits", MaxSlidingWindowRate)
	}
	if l.Burst < 1 || l.Burst > MaxRate {
		ps.add(field+".burst", "burst %d is out of range; use 1 to %d", l.Burst, MaxRate)
	}
	switch {
	case l.Period < MinPeriod || l.Period > MaxPeriod:
		ps.add(field+".period", "period %s is out of range; use %s to %s", l.Period, MinPeriod, MaxPeriod)
	case l.Period%time.Microsecond != 0:
		ps.add(field+".period", "period %s has sub-microsecond precision; round it to whole microseconds", l.Period)
	case l.Burst >= 1 && l.Burst <= MaxRate && l.Burst > MaxScaledLevel/l.PeriodMicros():
		ps.add(field, "burst %d × period %s is too large to count exactly (burst × period in µs must be at most 2^53); shorten the period or lower the burst", l.Burst, l.Period)
	}
	return l
}

func compileEndpoint(eq *v1alpha1.EndpointQuota, tiers map[string]Tier, ps *problems) (Endpoint, bool) {
	s := eq.Spec
	e := Endpoint{Name: s.Endpoint, Cost: s.Cost}
	if e.Cost == 0 {
		e.Cost = 1
	}
	if !ValidEndpointName(e.Name) {
		ps.add("spec.endpoint", "%q is not an endpoint name; use the {endpoint} of POST /api/{endpoint}, without slashes or spaces: 1 to 128 letters, digits, '.', '_', '~' or '-'", e.Name)
	}
	if e.Cost < 1 || e.Cost > MaxCost {
		ps.add("spec.cost", "cost %d is out of range; use 1 to %d", s.Cost, MaxCost)
	}
	if s.Limit != nil {
		l := compileLimit(*s.Limit, "spec.limit", ps)
		e.Limit = &l
	}
	seen := map[string]bool{}
	for i, tl := range s.Tiers {
		field := fmt.Sprintf("spec.tiers[%d]", i)
		if _, ok := tiers[tl.Tier]; !ok {
			ps.add(field+".tier", "tier %q is not one of the plane's tiers; use one of %s", tl.Tier, sortedKeys(tiers))
		}
		if seen[tl.Tier] {
			ps.add(field+".tier", "tier %q is listed twice", tl.Tier)
		}
		seen[tl.Tier] = true
		e.Tiers = append(e.Tiers, TierLimit{Tier: tl.Tier, Limit: compileLimit(tl.Limit, field+".limit", ps)})
	}
	slices.SortFunc(e.Tiers, func(a, b TierLimit) int { return cmp.Compare(a.Tier, b.Tier) })
	if len(s.Match) > MaxMatches {
		ps.add("spec.match", "an endpoint has at most %d matches, not %d; use a PathPrefix or Pattern that covers several", MaxMatches, len(s.Match))
	}
	for i, m := range s.Match {
		field := fmt.Sprintf("spec.match[%d]", i)
		cm := Match{Type: string(m.Path.Type), Path: m.Path.Value}
		if cm.Type == "" {
			cm.Type = PathPrefix
		}
		if _, ok := pathTypeRank[cm.Type]; !ok {
			ps.add(field+".path.type", "%q is not a path match type; use Exact, PathPrefix or Pattern", cm.Type)
		} else if problem := checkMatchPath(cm.Type, cm.Path); problem != "" {
			ps.add(field+".path.value", "%s", problem)
		}
		for _, method := range m.Methods {
			if !slices.Contains(httpMethods, method) {
				ps.add(field+".methods", "%q is not an HTTP method; use one of %s", method, strings.Join(httpMethods, ", "))
			}
		}
		cm.Methods = slices.Compact(slices.Sorted(slices.Values(m.Methods)))
		e.Match = append(e.Match, cm)
	}
	return e, !ps.found
}

// compileDescriptors applies the default entry keys and reports bad ones.
func compileDescriptors(in *v1alpha1.DescriptorMapping, ps *problems) Descriptors {
	d := Descriptors{Tenant: DefaultTenantEntries, Endpoint: DefaultEndpointEntries, APIKey: DefaultAPIKeyEntries}
	if in == nil {
		return d
	}
	for _, f := range []struct {
		field string
		in    []string
		out   *[]string
	}{{"tenant", in.Tenant, &d.Tenant}, {"endpoint", in.Endpoint, &d.Endpoint}, {"apiKey", in.APIKey, &d.APIKey}} {
		if f.in == nil {
			continue
		}
		if problem := checkEntryKeys(f.in); problem != "" {
			ps.add("spec.descriptors."+f.field, "%s", problem)
		}
		*f.out = slices.Clone(f.in)
	}
	seen := map[string]string{}
	for _, f := range []struct {
		field string
		keys  []string
	}{{"tenant", d.Tenant}, {"endpoint", d.Endpoint}, {"apiKey", d.APIKey}} {
		for _, k := range f.keys {
			if other, dup := seen[k]; dup && other != f.field {
				ps.add("spec.descriptors."+f.field, "entry key %q also names the %s; an entry key names one of tenant, endpoint and apiKey", k, other)
			}
			seen[k] = f.field
		}
	}
	return d
}

// compileKeyHashes gathers a tenant's api key hashes from spec.keyHashes and
// the Secret spec.keySecretRef names, sorted and without duplicates.
func compileKeyHashes(tq *v1alpha1.TenantQuota, secrets map[string]*corev1.Secret, ps *problems) ([]string, bool) {
	s := tq.Spec
	if len(s.KeyHashes) > MaxKeyHashes {
		ps.add("spec.keyHashes", "a tenant lists at most %d key hashes, not %d; keep more in keySecretRef's Secret", MaxKeyHashes, len(s.KeyHashes))
	}
	hashes := slices.Clone(s.KeyHashes)
	for i, h := range s.KeyHashes {
		if !ValidKeyHash(h) {
			ps.add(fmt.Sprintf("spec.keyHashes[%d]", i), "%q is not a key hash; write sha256: and the 64 lower-case hex digits that `printf %%s \"$KEY\" | sha256sum` prints", h)
		}
		if slices.Contains(s.KeyHashes[:i], h) {
			ps.add(fmt.Sprintf("spec.keyHashes[%d]", i), "key hash %q is listed twice", h)
		}
	}
	if ref := s.KeySecretRef; ref != nil {
		secret := secrets[tq.Namespace+"/"+ref.Name]
		switch {
		case secret == nil:
			ps.add("spec.keySecretRef.name", "Secret %q is not in namespace %s (or the manager may not read it); create it with one api key per data entry, or remove keySecretRef", ref.Name, tq.Namespace)
		case len(secret.Data) > MaxSecretKeys:
			ps.add("spec.keySecretRef.name", "Secret %q holds %d entries; a tenant takes at most %d keys from its Secret", ref.Name, len(secret.Data), MaxSecretKeys)
		default:
			for _, entry := range slices.Sorted(maps.Keys(secret.Data)) {
				v := strings.TrimSuffix(strings.TrimSuffix(string(secret.Data[entry]), "\n"), "\r")
				switch {
				case ValidKeyHash(v):
					hashes = append(hashes, v)
				case ValidName(v):
					hashes = append(hashes, HashKey(v))
				default:
					// Never quote the value: it is a secret.
					ps.add("spec.keySecretRef.name", "Secret %q entry %q is neither an api key (1 to %d printable ASCII characters without spaces) nor a key hash (sha256: and 64 hex digits)", ref.Name, entry, MaxNameBytes)
				}
			}
		}
	}
	hashes = slices.Compact(slices.Sorted(slices.Values(hashes)))
	if len(hashes) == 0 {
		hashes = nil
	}
	return hashes, !ps.found
}

func compileTenant(tq *v1alpha1.TenantQuota, defaultTier string, planeShards int64, tiers map[string]Tier, endpoints map[string]bool, ps *problems) (Tenant, bool) {
	s := tq.Spec
	t := Tenant{Name: s.Tenant, Tier: s.Tier}
	switch {
	case t.Name == "":
		ps.add("spec.tenant", "a TenantQuota needs the tenant id, as sent in X-Tenant")
	case !ValidName(t.Name):
		ps.add("spec.tenant", "%q cannot be sent in X-Tenant; use 1 to %d printable ASCII characters without spaces", t.Name, MaxNameBytes)
	}
	if t.Tier == "" {
		t.Tier = defaultTier
	}
	tier, ok := tiers[t.Tier]
	if !ok {
		ps.add("spec.tier", "tier %q is not one of the plane's tiers; use one of %s", t.Tier, sortedKeys(tiers))
	}
	t.Limit, t.Weight, t.Hard = tier.Tenant, tier.Weight, tier.Hard
	if s.Limit != nil {
		l := compileLimit(*s.Limit, "spec.limit", ps)
		t.Limit = &l
	}
	if s.Weight != nil {
		t.Weight = *s.Weight
		if t.Weight < 1 || t.Weight > MaxWeight {
			ps.add("spec.weight", "weight %d is out of range; use 1 to 1000000", t.Weight)
		}
	}
	if s.Hard != nil {
		t.Hard = *s.Hard
	}
	if pr := s.Priority; pr != nil {
		if pr.ContractValue < 0 || pr.ContractValue > MaxContractValue {
			ps.add("spec.priority.contractValue", "contractValue %d is out of range; use 0 to %d (USD a year)", pr.ContractValue, int64(MaxContractValue))
		}
		if pr.Importance < 0 || pr.Importance > MaxPriorityPercent {
			ps.add("spec.priority.importance", "importance %d is out of range; use 0 to %d (percent)", pr.Importance, MaxPriorityPercent)
		}
		if c := (Priority{ContractValue: pr.ContractValue, Realtime: pr.Realtime, Importance: pr.Importance}); c != (Priority{}) {
			t.Priority = &c
		}
	}
	if s.Shards != nil {
		if t.Shards = int64(*s.Shards); t.Shards < 1 || t.Shards > planeShards {
			ps.add("spec.shards", "%d is out of range; use 1 to the plane's shards, %d (raise the QuotaPlane's spec.shards first)", t.Shards, planeShards)
		}
		if t.Shards == 1 {
			t.Shards = 0 // not split: the canonical form
		}
	}
	seen := map[string]bool{}
	for i, k := range s.Keys {
		field := fmt.Sprintf("spec.keys[%d]", i)
		switch {
		case k.Key == "":
			ps.add(field+".key", "an api key override needs the key")
		case !ValidName(k.Key):
			ps.add(field+".key", "%q cannot be sent in X-Api-Key; use 1 to %d printable ASCII characters without spaces", k.Key, MaxNameBytes)
		}
		if seen[k.Key] {
			ps.add(field+".key", "api key %q is listed twice", k.Key)
		}
		seen[k.Key] = true
		t.Keys = append(t.Keys, KeyLimit{Key: k.Key, Limit: compileLimit(k.Limit, field+".limit", ps)})
	}
	slices.SortFunc(t.Keys, func(a, b KeyLimit) int { return cmp.Compare(a.Key, b.Key) })
	clear(seen)
	for i, e := range s.Endpoints {
		field := fmt.Sprintf("spec.endpoints[%d]", i)
		if !endpoints[e.Endpoint] {
			ps.add(field+".endpoint", "endpoint %q has no valid EndpointQuota in this plane; create one or remove this override", e.Endpoint)
		}
		if seen[e.Endpoint] {
			ps.add(field+".endpoint", "endpoint %q is listed twice", e.Endpoint)
		}
		seen[e.Endpoint] = true
		t.Endpoints = append(t.Endpoints, EndpointLimit{Endpoint: e.Endpoint, Limit: compileLimit(e.Limit, field+".limit", ps)})
	}
	slices.SortFunc(t.Endpoints, func(a, b EndpointLimit) int { return cmp.Compare(a.Endpoint, b.Endpoint) })
	return t, !ps.found
}

func compilePool(bp *v1alpha1.BurstPool, tiers map[string]Tier, ps *problems) (BurstPool, bool) {
	s := bp.Spec
	p := BurstPool{Size: s.Size, RefillRate: s.RefillRate, PerTenantCeiling: s.PerTenantCeiling}
	if p.Size < 1 || p.Size > MaxRate {
		ps.add("spec.size", "size %d is out of range; use 1 to %d tokens", p.Size, MaxRate)
	}
	if p.RefillRate < 0 || p.RefillRate > MaxRate {
		ps.add("spec.refillRate", "refillRate %d is out of range; use 0 to %d tokens per second", p.RefillRate, MaxRate)
	}
	if p.PerTenantCeiling < 1 || p.PerTenantCeiling > p.Size {
		ps.add("spec.perTenantCeiling", "perTenantCeiling %d must be between 1 and the pool size %d", p.PerTenantCeiling, p.Size)
	}
	for i, t := range s.Tiers {
		if _, ok := tiers[t]; !ok {
			ps.add(fmt.Sprintf("spec.tiers[%d]", i), "tier %q is not one of the plane's tiers; use one of %s", t, sortedKeys(tiers))
		}
	}
	p.Tiers = slices.Compact(slices.Sorted(slices.Values(s.Tiers)))
	return p, !ps.found
}

func sortedKeys(m map[string]Tier) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return strings.Join(keys, ", ")
}
