package controllers

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/redis/go-redis/v9"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/quotaplane/quotaplane/api/v1alpha1"
	"github.com/quotaplane/quotaplane/pkg/policy"
	"github.com/quotaplane/quotaplane/pkg/store"
	"github.com/quotaplane/quotaplane/pkg/upstream"
)

// +kubebuilder:rbac:groups=quotaplane.io,resources=upstreams,verbs=get;list;watch
// +kubebuilder:rbac:groups=quotaplane.io,resources=upstreams/status,verbs=get;update;patch

// Seed 004's pipeline in the manager: one upstream.Leader per plane that
// has Upstreams, on the elected manager only (see doc.go, "Upstreams").

// Reasons of an Upstream's Ready condition, besides ReasonInvalid and
// ReasonPublishFailed.
const (
	// ReasonSensing: the upstream is sensed and its plan published each
	// cycle.
	ReasonSensing = "Sensing"
	// ReasonSensingDisabled: declared with sensing Disabled; it stays
	// Healthy and its tenants keep their static tiers.
	ReasonSensingDisabled = "SensingDisabled"
	// ReasonNotSensed: the plane's policy cannot be read from Redis (none
	// published yet, or Redis away), so no cycle runs.
	ReasonNotSensed = "NotSensed"
)

// Reasons of the Events the upstream leaders record.
const (
	// EventClassChanged, on a TenantQuota: its tenant's class on an
	// upstream changed (Normal up, Warning down).
	EventClassChanged = "ClassChanged"
	// EventClassesChanged, on an Upstream: more tenants changed class in
	// one cycle than get an Event each (maxClassEvents); it says how many.
	EventClassesChanged = "ClassesChanged"
	// EventPhaseChanged, on an Upstream: its phase changed (Warning worse,
	// Normal on the way back).
	EventPhaseChanged = "PhaseChanged"
	// EventWebhookUnavailable, on the QuotaPlane: its outage webhook's
	// Secret cannot be read, so no notice is sent.
	EventWebhookUnavailable = "WebhookUnavailable"
)

// maxClassEvents bounds the ClassChanged Events of one plane's cycle: a
// cycle that reclassifies a thousand tenants records this many and one
// ClassesChanged summary per upstream, not a thousand Events.
const maxClassEvents = 50

// UpstreamOptions tune the upstream leaders. The zero value is what the
// manager runs with; tests run the cycles faster.
type UpstreamOptions struct {
	// Interval is how often the QuotaPlanes and Upstreams are listed to
	// start and stop leaders. Default 2s.
	Interval time.Duration
	// Tick is each Leader's Tick: how often it looks for due probes and
	// cycles. Default the Leader's (1s).
	Tick time.Duration
	// Clock is each Leader's clock; nil is time.Now. A clock that runs
	// faster than real time runs the whole pipeline (probe intervals,
	// windows, cycles, recovery) faster, consistently.
	Clock func() time.Time
	// Notifier configures the class-change webhooks' notifiers.
	Notifier upstream.NotifierOptions
}

// upstreamLeaders is the manager.Runnable that runs one upstream.Leader
// per plane that has at least one Upstream. Its Start runs only on the
// elected manager (it needs leader election, as every controller), so two
// managers never sense, publish plans or notify at the same time; a leader
// taking over restores phases and classes from the plan in Redis.
type upstreamLeaders struct {
	client   client.Client // the manager's cache
	reader   client.Reader // the API server, for Secrets (get, never list)
	stores   *stores
	redis    redis.UniversalClient
	recorder events.EventRecorder
	metrics  *upstreamMetrics
	logger   *slog.Logger
	opts     UpstreamOptions

	// running holds the leader of each namespace; owned by Start's
	// goroutine.
	running map[string]*planeLeader
}

// NeedLeaderElection: only the elected manager runs the leaders.
func (u *upstreamLeaders) NeedLeaderElection() bool { return true }

// Start keeps the set of leaders equal to the planes with Upstreams until
// ctx ends, then stops every leader and waits for them.
func (u *upstreamLeaders) Start(ctx context.Context) error {
	u.running = map[string]*planeLeader{}
	defer func() {
		for _, pl := range u.running {
			pl.cancel() // all at once: each waits for its probes and cycle
		}
		for ns, pl := range u.running {
			pl.stop()
			delete(u.running, ns)
		}
	}()
	t := time.NewTicker(u.opts.Interval)
	defer t.Stop()
	for {
		if err := u.sync(ctx); err != nil && ctx.Err() == nil {
			u.logger.Warn("upstream leaders not synced; retrying", "err", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// sync starts a leader for each plane with Upstreams that has none, and
// stops those of planes that no longer have a QuotaPlane or an Upstream.
func (u *upstreamLeaders) sync(ctx context.Context) error {
	var (
		planes v1alpha1.QuotaPlaneList
		ups    v1alpha1.UpstreamList
	)
	if err := u.client.List(ctx, &planes); err != nil {
		return fmt.Errorf("list QuotaPlanes: %w", err)
	}
	if err := u.client.List(ctx, &ups); err != nil {
		return fmt.Errorf("list Upstreams: %w", err)
	}
	want, primaries := upstreamPlanes(planes.Items, ups.Items)
	for _, ns := range slices.Sorted(maps.Keys(u.running)) {
		pl := u.running[ns]
		if want[ns] == pl.name {
			continue
		}
		pl.stop()
		delete(u.running, ns)
		if primaries[ns] == pl.name {
			// The plane is still there and its last Upstream is gone:
			// lift the gate now rather than when the plan expires.
			if err := u.redis.Del(ctx, upstream.PlanKey(pl.id)).Err(); err != nil {
				u.logger.Warn("upstream plan of a plane without Upstreams not deleted; it expires on its own", "plane", pl.id, "err", err)
			}
		}
	}
	for _, ns := range slices.Sorted(maps.Keys(want)) {
		if u.running[ns] == nil {
			u.running[ns] = u.start(ctx, ns, want[ns])
		}
	}
	return nil
}

// upstreamPlanes is, per namespace, the plane to run a leader for (its
// primary QuotaPlane, when it has at least one Upstream) and every
// namespace's primary QuotaPlane.
func upstreamPlanes(planes []v1alpha1.QuotaPlane, ups []v1alpha1.Upstream) (want, primaries map[string]string) {
	primary := map[string]*v1alpha1.QuotaPlane{}
	for i := range planes {
		qp := &planes[i]
		if first := primary[qp.Namespace]; first == nil || olderPlane(qp, first) {
			primary[qp.Namespace] = qp
		}
	}
	want, primaries = map[string]string{}, map[string]string{}
	for ns, qp := range primary {
		primaries[ns] = qp.Name
	}
	for i := range ups {
		if name, ok := primaries[ups[i].Namespace]; ok {
			want[ups[i].Namespace] = name
		}
	}
	return want, primaries
}

// start starts the leader of plane ns/name.
func (u *upstreamLeaders) start(ctx context.Context, ns, name string) *planeLeader {
	ctx, cancel := context.WithCancel(ctx)
	pl := &planeLeader{u: u, ns: ns, name: name, id: ns + "/" + name, ctx: ctx, cancel: cancel, done: make(chan struct{}),
		series: map[string]bool{}, phases: map[string]upstream.Phase{}}
	pl.leader = &upstream.Leader{
		Plane:   pl.id,
		Redis:   u.redis,
		Load:    pl.load,
		Secret:  pl.secret,
		Observe: pl.observe,
		Clock:   u.opts.Clock,
		Logger:  u.logger.With("plane", pl.id),
		Tick:    u.opts.Tick,
	}
	u.logger.Info("upstream leader started", "plane", pl.id)
	go func() {
		defer close(pl.done)
		_ = pl.leader.Run(ctx)
		// Run has returned: no Load or Observe runs any more.
		pl.closeNotifier()
		u.metrics.forget(ns)
	}()
	return pl
}

// planeLeader is one plane's leader and what its Load and Observe keep
// between them. Load and Observe run on the leader's goroutine, one after
// the other, so the fields below ctx are owned by it and need no lock.
type planeLeader struct {
	u            *upstreamLeaders
	ns, name, id string
	leader       *upstream.Leader
	cancel       context.CancelFunc
	done         chan struct{}

	ctx context.Context // the leader's: Observe has none of its own
	// The last Load: the namespace's Upstreams by name, the problems of
	// each that did not compile, and the policy they were compiled against
	// (policyErr when it could not be read).
	objs          map[string]*v1alpha1.Upstream
	problems      map[string][]string
	policyVersion int64
	policyErr     error
	// The class-change webhook: its notifier (nil when the plane has
	// none, or its Secret cannot be read), what it was built from, the
	// Secret problem last recorded, and the notifier's counts already
	// added to the metrics.
	notifier    *upstream.Notifier
	hook        webhookConfig
	hookProblem string
	hookCounted [3]int64
	// series are the upstreams with metric series; phases the phase
	// each was last seen in, for the PhaseChanged Event.
	series map[string]bool
	phases map[string]upstream.Phase
}

// webhookConfig is what a notifier is built from.
type webhookConfig struct {
	url, secret string
}

// stop stops the leader and waits until it has stopped.
func (pl *planeLeader) stop() {
	pl.cancel()
	<-pl.done
	pl.u.logger.Info("upstream leader stopped", "plane", pl.id)
}

// load is the Leader's Load: the policy in force in Redis, as the compiler
// publishes it, and the namespace's Upstreams from the cache, compiled
// against it. The Upstreams that do not compile are kept out of the cycle
// with their problems, which Observe writes into their status.
func (pl *planeLeader) load(ctx context.Context) (*policy.Policy, []policy.Upstream, error) {
	var list v1alpha1.UpstreamList
	if err := pl.u.client.List(ctx, &list, client.InNamespace(pl.ns)); err != nil {
		pl.objs = nil // nothing to write this cycle
		return nil, nil, fmt.Errorf("list the Upstreams of namespace %s: %w", pl.ns, err)
	}
	pl.objs = make(map[string]*v1alpha1.Upstream, len(list.Items))
	objs := make([]*v1alpha1.Upstream, len(list.Items))
	for i := range list.Items {
		objs[i] = &list.Items[i]
		pl.objs[objs[i].Name] = objs[i]
	}
	pl.problems, pl.policyVersion = nil, 0
	p, err := pl.policy(ctx)
	pl.policyErr = err
	if err != nil {
		return nil, nil, err
	}
	pl.policyVersion = p.Version()
	specs, problems := policy.CompileUpstreams(p, objs)
	pl.problems = map[string][]string{}
	for _, pr := range problems {
		pl.problems[pr.Name] = append(pl.problems[pr.Name], strings.TrimPrefix(pr.Field+": "+pr.Message, ": "))
	}
	pl.syncNotifier(ctx)
	return p, specs, nil
}

// policy reads the plane's policy in force.
func (pl *planeLeader) policy(ctx context.Context) (*policy.Policy, error) {
	s, err := pl.u.stores.get(pl.id)
	if err != nil {
		return nil, fmt.Errorf("the policy store of plane %s: %w", pl.id, err)
	}
	p, err := s.Current(ctx)
	switch {
	case errors.Is(err, store.ErrNoPolicy):
		return nil, fmt.Errorf("no policy of plane %s is published yet (see the QuotaPlane's Ready condition): %w", pl.id, err)
	case err != nil:
		return nil, fmt.Errorf("read the policy of plane %s from Redis: %w", pl.id, err)
	}
	return p, nil
}

// secret is the Leader's Secret: a probe header's value, read from the API
// server (one get, never a list or a watch: the manager holds no Secret it
// does not use). A trailing newline is dropped, as the CRD says.
func (pl *planeLeader) secret(ctx context.Context, ref policy.SecretKeyRef) (string, error) {
	return readSecretKey(ctx, pl.u.reader, pl.ns, ref.Name, ref.Key)
}

func readSecretKey(ctx context.Context, r client.Reader, ns, name, key string) (string, error) {
	var s corev1.Secret
	if err := r.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, &s); err != nil {
		return "", fmt.Errorf("read Secret %s/%s: %w", ns, name, err)
	}
	v, ok := s.Data[key]
	if !ok {
		return "", fmt.Errorf("the Secret %s/%s has no entry %q", ns, name, key)
	}
	return strings.TrimSuffix(strings.TrimSuffix(string(v), "\n"), "\r"), nil
}

// syncNotifier makes the plane's notifier match its QuotaPlane's
// spec.outage.webhook: none without one, a new one when its URL or secret
// changed. The Secret is read each cycle (one get), so a rotated secret
// signs from the next cycle on.
func (pl *planeLeader) syncNotifier(ctx context.Context) {
	var qp v1alpha1.QuotaPlane
	err := pl.u.client.Get(ctx, types.NamespacedName{Namespace: pl.ns, Name: pl.name}, &qp)
	if err != nil || qp.Spec.Outage == nil || qp.Spec.Outage.Webhook == nil || !policy.ValidHTTPURL(qp.Spec.Outage.Webhook.URL) {
		pl.closeNotifier()
		return
	}
	w := qp.Spec.Outage.Webhook
	want := webhookConfig{url: w.URL}
	if ref := w.SecretRef; ref != nil {
		secret, err := readSecretKey(ctx, pl.u.reader, pl.ns, ref.Name, ref.Key)
		if err != nil {
			// Unsigned notices would be refused, or worse, trusted: send none.
			pl.closeNotifier()
			problem := fmt.Sprintf("no class-change notice is sent to the outage webhook until its secret can be read: %v", err)
			if problem != pl.hookProblem {
				pl.hookProblem = problem
				pl.u.recorder.Eventf(&qp, nil, corev1.EventTypeWarning, EventWebhookUnavailable, "Notify", "%s", problem)
			}
			return
		}
		want.secret = secret
	}
	pl.hookProblem = ""
	if pl.notifier != nil && pl.hook == want {
		return
	}
	pl.closeNotifier()
	pl.notifier, pl.hook = upstream.NewNotifier(want.url, []byte(want.secret), pl.u.opts.Notifier), want
}

// closeNotifier stops the notifier, if any, once its counts are in the
// metrics.
func (pl *planeLeader) closeNotifier() {
	if pl.notifier == nil {
		return
	}
	pl.notifier.Close()
	pl.countNotices()
	pl.notifier, pl.hook, pl.hookCounted = nil, webhookConfig{}, [3]int64{}
}

// countNotices adds what the notifier counted since the last call to the
// metrics.
func (pl *planeLeader) countNotices() {
	if pl.notifier == nil {
		return
	}
	sent, dropped, failed := pl.notifier.Stats()
	now := [3]int64{sent, dropped, failed}
	for i, result := range [3]string{"sent", "dropped", "failed"} {
		if d := now[i] - pl.hookCounted[i]; d > 0 {
			pl.u.metrics.notices.WithLabelValues(pl.ns, result).Add(float64(d))
		}
	}
	pl.hookCounted = now
}

// observe is the Leader's Observe: each cycle's outcome goes into the
// Upstreams' status, Events, the webhook and the metrics.
func (pl *planeLeader) observe(c *upstream.Cycle) {
	m := pl.u.metrics
	m.cycles.WithLabelValues(pl.ns).Observe(c.Duration.Seconds())
	if c.Err != nil {
		m.cycleFailures.WithLabelValues(pl.ns).Inc()
	}
	sensed := make(map[string]*upstream.UpstreamCycle, len(c.Upstreams))
	for i := range c.Upstreams {
		sensed[c.Upstreams[i].Spec.Name] = &c.Upstreams[i]
	}
	for name, obj := range pl.objs {
		// A leader's first cycle: the phase the status shows is the one
		// a PhaseChanged Event starts from (the plan restored it).
		if _, known := pl.phases[name]; !known {
			if p, ok := upstream.ParsePhase(string(obj.Status.Phase)); ok {
				pl.phases[name] = p
			}
		}
	}
	for _, name := range slices.Sorted(maps.Keys(pl.objs)) {
		obj := pl.objs[name]
		st, ok := desiredUpstreamStatus(obj, sensed[name], pl.problems[name], pl.policyErr, c.Err, pl.policyVersion)
		if !ok {
			continue
		}
		if err := pl.writeStatus(obj, &st); err != nil && pl.ctx.Err() == nil {
			pl.u.logger.Warn("upstream status not written; written again next cycle", "plane", pl.id, "upstream", name, "err", err)
		}
	}
	pl.tell(c)
	pl.record(c)
}

// writeStatus writes obj's status when it differs from st.
func (pl *planeLeader) writeStatus(obj *v1alpha1.Upstream, st *v1alpha1.UpstreamStatus) error {
	if equality.Semantic.DeepEqual(&obj.Status, st) {
		return nil
	}
	before := obj.DeepCopy()
	obj.Status = *st
	ctx, cancel := context.WithTimeout(pl.ctx, 10*time.Second)
	defer cancel()
	if err := pl.u.client.Status().Patch(ctx, obj, client.MergeFrom(before)); err != nil {
		obj.Status = before.Status
		return fmt.Errorf("write the status of Upstream %s/%s: %w", obj.Namespace, obj.Name, err)
	}
	return nil
}

// desiredUpstreamStatus is the status obj should have after a cycle: uc is
// its part of the cycle (nil when it was not sensed), problems why it did
// not compile, policyErr why the plane's policy could not be read,
// cycleErr why the plan was not published. It is false when there is
// nothing to write (the object was listed after the cycle's Load).
func desiredUpstreamStatus(obj *v1alpha1.Upstream, uc *upstream.UpstreamCycle, problems []string, policyErr, cycleErr error, policyVersion int64) (v1alpha1.UpstreamStatus, bool) {
	st := *obj.Status.DeepCopy()
	gen := obj.Generation
	cond := metav1.Condition{Type: v1alpha1.ConditionReady, Status: metav1.ConditionFalse, ObservedGeneration: gen}
	switch {
	case policyErr != nil:
		// The last plan stays in Redis until it expires; what the status
		// says of it stays too.
		cond.Reason = ReasonNotSensed
		cond.Message = "not sensed, and no plan is published, until the plane's policy can be read (the last plan applies until it expires): " + policyErr.Error()
	case len(problems) > 0:
		st = v1alpha1.UpstreamStatus{QuotaStatus: v1alpha1.QuotaStatus{Conditions: st.Conditions}}
		cond.Reason = ReasonInvalid
		cond.Message = "not sensed until fixed: " + strings.Join(problems, "; ")
	case uc == nil:
		return st, false
	default:
		st.PolicyVersion = policyVersion
		st.Confidence = fmt.Sprintf("%.2f", min(max(uc.Terms.Confidence, 0), 1))
		st.Phase = v1alpha1.UpstreamPhase(uc.Phase.String())
		st.LastTransitionTime = statusTime(uc.Since)
		st.LastProbeTime = statusTime(uc.LastProbe)
		st.LastProbeError = truncate(uc.LastProbeError, 1024)
		st.Classes = &v1alpha1.UpstreamClasses{
			Critical:  int32(uc.Classes[upstream.Critical]),
			High:      int32(uc.Classes[upstream.High]),
			Medium:    int32(uc.Classes[upstream.Medium]),
			Low:       int32(uc.Classes[upstream.Low]),
			Suspended: int32(uc.Classes[upstream.Suspended]),
		}
		switch {
		case cycleErr != nil:
			cond.Reason = ReasonPublishFailed
			cond.Message = "sensed, but the plan was not published and is published again next cycle (the last plan applies until it expires): " + cycleErr.Error()
		case !uc.Spec.Sensing:
			cond.Status, cond.Reason = metav1.ConditionTrue, ReasonSensingDisabled
			cond.Message = "sensing is Disabled: the upstream stays Healthy and its tenants keep their static tiers"
		default:
			cond.Status, cond.Reason = metav1.ConditionTrue, ReasonSensing
			cond.Message = "sensed by " + signals(uc.Spec) + "; its plan is published each cycle"
		}
		if uc.HeaderProblem != "" {
			cond.Message += "; the probe's rate-limit headers make no reading: " + uc.HeaderProblem
		}
	}
	st.ObservedGeneration = gen
	cond.Message = truncate(cond.Message, maxMessage)
	meta.SetStatusCondition(&st.Conditions, cond)
	return st, true
}

// signals names what an upstream is sensed by.
func signals(u policy.Upstream) string {
	switch {
	case u.Probe != nil && u.Passive:
		return "its probe and the passive reports"
	case u.Probe != nil:
		return "its probe"
	}
	return "the passive reports"
}

// statusTime is t as the API stores it (whole seconds), nil when zero, so
// that an unchanged time compares equal to what was written.
func statusTime(t time.Time) *metav1.Time {
	if t.IsZero() {
		return nil
	}
	mt := metav1.NewTime(t).Rfc3339Copy()
	return &mt
}

// truncate cuts s to at most n bytes, at a rune's start, marking the cut.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n - 3
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "..."
}

// tell records the cycle's Events and posts its class changes to the
// webhook. A tenant's change is an Event on its TenantQuota, at most
// maxClassEvents a cycle; the changes beyond are summed up on their
// Upstream.
func (pl *planeLeader) tell(c *upstream.Cycle) {
	budget := maxClassEvents
	var tenants map[string]*v1alpha1.TenantQuota
	for i := range c.Upstreams {
		uc := &c.Upstreams[i]
		up := pl.objs[uc.Spec.Name]
		conf := uc.Terms.Confidence
		if uc.PhaseChanged && up != nil {
			from := pl.phases[uc.Spec.Name] // Healthy when unknown
			pl.u.recorder.Eventf(up, nil, phaseEventType(from, uc.Phase), EventPhaseChanged, "Sense",
				"phase %s → %s (confidence %.2f: error %.2f, latency %.2f, quota %.2f, staleness %.2f)%s",
				from, uc.Phase, conf, uc.Terms.Error, uc.Terms.Latency, uc.Terms.Quota, uc.Terms.Staleness, probeNote(uc))
		}
		if len(uc.Changes) == 0 {
			continue
		}
		if tenants == nil {
			tenants = pl.tenantQuotas()
		}
		var omitted, down int
		for _, ch := range uc.Changes {
			if ch.To < ch.From {
				down++
			}
			pl.u.metrics.changes.WithLabelValues(pl.ns, uc.Spec.Name, ch.From.String(), ch.To.String()).Inc()
			if pl.notifier != nil {
				pl.notifier.Notify(upstream.Notice{Plane: pl.id, Upstream: uc.Spec.Name, Tenant: ch.Tenant, From: ch.From, To: ch.To,
					Score: ch.Score, Confidence: conf, Phase: uc.Phase, At: c.At})
			}
			tq := tenants[ch.Tenant]
			if budget == 0 || tq == nil {
				omitted++
				continue
			}
			budget--
			kind := corev1.EventTypeNormal
			if ch.To < ch.From {
				kind = corev1.EventTypeWarning
			}
			var related runtime.Object // not a nil *Upstream: the recorder would dereference it
			if up != nil {
				related = up
			}
			pl.u.recorder.Eventf(tq, related, kind, EventClassChanged, "Reclassify", "class on upstream %s: %s → %s (score %.2f, confidence %.2f, %s)",
				uc.Spec.Name, ch.From, ch.To, ch.Score, conf, uc.Phase)
		}
		if omitted > 0 && up != nil {
			kind := corev1.EventTypeNormal
			if down > 0 {
				kind = corev1.EventTypeWarning
			}
			pl.u.recorder.Eventf(up, nil, kind, EventClassesChanged, "Reclassify",
				"%d tenants changed class on this upstream in this cycle (%d down, %d up); %d of them have no Event on their TenantQuota (at most %d a cycle per plane): see quotaplane_manager_upstream_tenants and the plan",
				len(uc.Changes), down, len(uc.Changes)-down, omitted, maxClassEvents)
		}
	}
	pl.countNotices()
}

// probeNote is the last probe's failure, for an Event.
func probeNote(uc *upstream.UpstreamCycle) string {
	if uc.LastProbeError == "" {
		return ""
	}
	return "; last probe: " + truncate(uc.LastProbeError, 256)
}

// phaseEventType is Normal for a step towards Healthy, Warning otherwise.
func phaseEventType(from, to upstream.Phase) string {
	switch {
	case to == upstream.Healthy:
		return corev1.EventTypeNormal
	case from >= upstream.Phase1 && to > from:
		return corev1.EventTypeNormal // Phase1 → Phase2 → Phase3
	}
	return corev1.EventTypeWarning
}

// tenantQuotas maps the namespace's tenants (spec.tenant) to their
// TenantQuota, from the cache; the first by name when two name one tenant.
func (pl *planeLeader) tenantQuotas() map[string]*v1alpha1.TenantQuota {
	var list v1alpha1.TenantQuotaList
	if err := pl.u.client.List(pl.ctx, &list, client.InNamespace(pl.ns)); err != nil {
		pl.u.logger.Warn("TenantQuotas not listed; class changes get no Event this cycle", "plane", pl.id, "err", err)
		return map[string]*v1alpha1.TenantQuota{}
	}
	slices.SortFunc(list.Items, func(a, b v1alpha1.TenantQuota) int { return cmp.Compare(a.Name, b.Name) })
	m := make(map[string]*v1alpha1.TenantQuota, len(list.Items))
	for i := range list.Items {
		if _, ok := m[list.Items[i].Spec.Tenant]; !ok {
			m[list.Items[i].Spec.Tenant] = &list.Items[i]
		}
	}
	return m
}

// record sets the cycle's gauges and drops the series of upstreams no
// longer sensed.
func (pl *planeLeader) record(c *upstream.Cycle) {
	m := pl.u.metrics
	now := map[string]bool{}
	for i := range c.Upstreams {
		uc := &c.Upstreams[i]
		name := uc.Spec.Name
		now[name] = true
		pl.phases[name] = uc.Phase
		m.confidence.WithLabelValues(pl.ns, name).Set(uc.Terms.Confidence)
		m.phase.WithLabelValues(pl.ns, name).Set(float64(uc.Phase))
		for class := range upstream.Class(upstream.NumClasses) {
			m.tenants.WithLabelValues(pl.ns, name, class.String()).Set(float64(uc.Classes[class]))
		}
	}
	if c.Plan == nil {
		return // not loaded: the last cycle's values stand
	}
	for name := range pl.series {
		if !now[name] {
			m.forgetUpstream(pl.ns, name)
			delete(pl.phases, name)
		}
	}
	pl.series = now
}
