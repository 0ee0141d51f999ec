package controllers

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/quotaplane/quotaplane/api/v1alpha1"
	"github.com/quotaplane/quotaplane/pkg/policy"
)

// +kubebuilder:rbac:groups=apps,resources=deployments/scale,verbs=get;update;patch
// +kubebuilder:rbac:groups=apps,resources=deployments,verbs=get

// ConditionScaled is the QuotaPlane condition that says whether the manager
// sizes the enforcer Deployment.
const ConditionScaled = "Scaled"

// planeReconciler owns the QuotaPlane's status: Ready like every quota
// object, plus the published version, the enforcers that run it, and the
// enforcer fleet's size, which it sets. It runs again every interval to
// follow the enforcers' reports.
type planeReconciler struct {
	client client.Client
	// reader reads a named Deployment straight from the API server (its
	// enforcer label): the manager caches no Deployments and may not list
	// them.
	reader      client.Reader
	maxReplicas int32 // Options.MaxEnforcerReplicas
	stores      *stores
	verdicts    *verdicts
	recorder    events.EventRecorder
	scaler      *scaler
	interval    time.Duration
}

func (r *planeReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var qp v1alpha1.QuotaPlane
	if err := r.client.Get(ctx, req.NamespacedName, &qp); err != nil {
		if apierrors.IsNotFound(err) {
			r.scaler.forget(req.String())
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	next := ctrl.Result{RequeueAfter: r.interval}
	v := r.verdicts.get(qp.Namespace)
	base, ok := desiredStatus(v, "QuotaPlane", &qp, &qp.Status.QuotaStatus)
	if !ok {
		return next, nil
	}
	st := *qp.Status.DeepCopy()
	st.QuotaStatus = base
	st.RejectedObjects, st.HeldObjects = v.counts()
	enforced := metav1.Condition{Type: v1alpha1.ConditionEnforced, Status: metav1.ConditionFalse, ObservedGeneration: qp.Generation}
	var scaleErr error
	if v.publishedPlane == qp.Name && v.version > 0 {
		st.PublishedVersion, st.PublishedHash = v.version, v.hash
		fleet := r.readFleet(ctx, &qp, v.version)
		enforced = fleet.condition(&qp, v.version)
		st.EnforcersReady, st.Enforcers = fleet.ready, fleet.live
		if v.fleet.DeploymentName != "" {
			var cond metav1.Condition
			cond, scaleErr = r.scale(ctx, &qp, v.fleet, v.mode, fleet, &st)
			meta.SetStatusCondition(&st.Conditions, cond)
		}
	} else {
		st.EnforcersReady, st.Enforcers = 0, 0
		enforced.Reason = "NotPublished"
		enforced.Message = "no version of this QuotaPlane is published yet; see the Ready condition"
		if c := v.objects[objectKey{"QuotaPlane", qp.Name}]; c.duplicateOf != "" {
			enforced.Message = fmt.Sprintf("this QuotaPlane is not compiled: QuotaPlane %s is the namespace's plane", c.duplicateOf)
		}
	}
	meta.SetStatusCondition(&st.Conditions, enforced)
	setKstatus(&st, qp.Generation)
	if err := writeStatus(ctx, r.client, r.recorder, &qp, &qp.Status, &st, func() { qp.Status = st }); err != nil {
		return next, err
	}
	return next, scaleErr
}

// counts is how many objects of v are rejected (left out, or a second
// QuotaPlane) and how many are held.
func (v *verdict) counts() (rejected, held int32) {
	for _, c := range v.objects {
		switch {
		case c.held > 0:
			held++
		case len(c.problems) > 0, c.duplicateOf != "":
			rejected++
		}
	}
	return rejected, held
}

// fleetView is what the enforcers' reports say of one plane.
type fleetView struct {
	err     error   // the reports could not be read
	live    int32   // enforcers whose report has not lapsed
	ready   int32   // of those, the ones that run the published version
	rate    float64 // their decisions per second, summed
	lagging []string
}

// maxNamed bounds the enforcers a condition names.
const maxNamed = 5

// readFleet reads the enforcers' live reports of qp's plane from Redis.
// Reports lapse on their own (each carries its expiry), so an enforcer that
// stopped is not counted; while Redis cannot be read, nothing is.
func (r *planeReconciler) readFleet(ctx context.Context, qp *v1alpha1.QuotaPlane, version int64) fleetView {
	s, err := r.stores.get(qp.Namespace + "/" + qp.Name)
	if err != nil {
		return fleetView{err: err}
	}
	reports, err := s.Enforcers(ctx)
	if err != nil {
		log.FromContext(ctx).Info("enforcer reports unreadable; the fleet's size is kept and Enforced is Unknown", "err", err)
		return fleetView{err: err}
	}
	var f fleetView
	for _, rep := range reports {
		f.live++
		f.rate += rep.DecisionsPerSec
		if rep.PolicyVersion == version {
			f.ready++
		} else if len(f.lagging) < maxNamed {
			f.lagging = append(f.lagging, fmt.Sprintf("%s (version %d)", rep.ID, rep.PolicyVersion))
		}
	}
	return f
}

// condition is the Enforced condition of qp by f: True when every live
// enforcer runs version (and at least one does). All live enforcers, not a
// replica count: a pod that started after the publish loads the current
// version before it reports, so a scale-up does not make the plane
// un-enforced, while a pod stuck on an older version does.
func (f fleetView) condition(qp *v1alpha1.QuotaPlane, version int64) metav1.Condition {
	c := metav1.Condition{Type: v1alpha1.ConditionEnforced, Status: metav1.ConditionFalse, ObservedGeneration: qp.Generation}
	plane := qp.Namespace + "/" + qp.Name
	switch {
	case f.err != nil:
		c.Status, c.Reason = metav1.ConditionUnknown, "FleetUnknown"
		c.Message = "the enforcers' reports cannot be read from Redis, so whether they run version " + strconv.FormatInt(version, 10) + " is unknown: " + f.err.Error()
	case f.live == 0:
		c.Reason = "NoEnforcers"
		c.Message = fmt.Sprintf("no enforcer reports running plane %s: start the enforcer fleet with QUOTAPLANE_PLANE=%s", plane, plane)
	case f.ready < f.live:
		c.Reason = "RollingOut"
		c.Message = fmt.Sprintf("%d of %d enforcers run version %d; waiting for %s", f.ready, f.live, version, strings.Join(f.lagging, ", "))
		if n := int(f.live-f.ready) - len(f.lagging); n > 0 {
			c.Message += fmt.Sprintf(" and %d more", n)
		}
	default:
		c.Status, c.Reason = metav1.ConditionTrue, "Enforced"
		c.Message = fmt.Sprintf("all %d enforcers run version %d", f.live, version)
	}
	return c
}

// setKstatus sets kstatus's abnormal-true conditions from the others, for
// Flux and other kstatus readers: Stalled while something needs a fix
// (Ready=False other than a failed publish, or objects rejected or held),
// Reconciling while the latest version is on its way (publish retried,
// enforcers rolling out or not reporting). Both are False otherwise.
func setKstatus(st *v1alpha1.QuotaPlaneStatus, generation int64) {
	ready := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionReady)
	enforced := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionEnforced)
	stalled := metav1.Condition{Type: v1alpha1.ConditionStalled, Status: metav1.ConditionFalse, Reason: "Valid", Message: "the plane and its objects are valid", ObservedGeneration: generation}
	reconciling := metav1.Condition{Type: v1alpha1.ConditionReconciling, Status: metav1.ConditionFalse, Reason: "Enforced", Message: "the published version is enforced", ObservedGeneration: generation}
	switch {
	case ready != nil && ready.Status == metav1.ConditionFalse && ready.Reason != ReasonPublishFailed:
		stalled.Status, stalled.Reason, stalled.Message = metav1.ConditionTrue, ready.Reason, ready.Message
	case st.RejectedObjects > 0 || st.HeldObjects > 0:
		stalled.Status, stalled.Reason = metav1.ConditionTrue, "ObjectsNeedFixing"
		stalled.Message = fmt.Sprintf("%d quota objects are rejected and %d held: see their Ready conditions", st.RejectedObjects, st.HeldObjects)
	}
	if stalled.Status == metav1.ConditionFalse {
		switch {
		case ready != nil && ready.Status == metav1.ConditionFalse:
			reconciling.Status, reconciling.Reason, reconciling.Message = metav1.ConditionTrue, ready.Reason, ready.Message
		case enforced == nil || enforced.Status != metav1.ConditionTrue:
			reconciling.Status, reconciling.Reason, reconciling.Message = metav1.ConditionTrue, "NotEnforced", "the published version is not yet enforced"
			if enforced != nil {
				reconciling.Reason, reconciling.Message = enforced.Reason, enforced.Message
			}
		}
	} else {
		reconciling.Reason, reconciling.Message = "Stalled", "waiting for a fix: see Stalled"
	}
	meta.SetStatusCondition(&st.Conditions, stalled)
	meta.SetStatusCondition(&st.Conditions, reconciling)
}

// scale sizes the enforcer Deployment of f through its scale subresource.
//
// A mode local plane is kept at one replica at most, whatever its spec asks:
// each enforcer of a local plane decides every request on its own with the
// whole of every limit, so N replicas behind one Service would admit up to
// N times every limit. The Scaled condition says so (reason LocalMode) and
// how to scale instead: mode central or local-reconciled.
func (r *planeReconciler) scale(ctx context.Context, qp *v1alpha1.QuotaPlane, f policy.Enforcer, mode string, fleet fleetView, st *v1alpha1.QuotaPlaneStatus) (metav1.Condition, error) {
	cond := metav1.Condition{Type: ConditionScaled, Status: metav1.ConditionFalse, ObservedGeneration: qp.Generation}
	dep := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: qp.Namespace, Name: f.DeploymentName}}
	if err := r.reader.Get(ctx, client.ObjectKeyFromObject(dep), dep); err != nil {
		if apierrors.IsNotFound(err) {
			cond.Reason = "DeploymentNotFound"
			cond.Message = fmt.Sprintf("Deployment %s/%s does not exist: create the enforcer Deployment or fix spec.enforcer.deploymentName", qp.Namespace, f.DeploymentName)
			return cond, nil
		}
		cond.Reason, cond.Message = "ScaleFailed", "reading the Deployment: "+err.Error()
		return cond, err
	}
	if dep.Labels[EnforcerLabel] != "true" {
		// Whoever may create a QuotaPlane must not scale what it is not.
		cond.Reason = "NotAnEnforcer"
		cond.Message = fmt.Sprintf("Deployment %s/%s is not labelled %s: \"true\", so it is not scaled: name quotaplane's enforcer Deployment in spec.enforcer.deploymentName, or label it if it is one", qp.Namespace, f.DeploymentName, EnforcerLabel)
		return cond, nil
	}
	var scale autoscalingv1.Scale
	if err := r.client.SubResource("scale").Get(ctx, dep, &scale); err != nil {
		cond.Reason, cond.Message = "ScaleFailed", "reading the Deployment's scale: "+err.Error()
		return cond, err
	}
	asked := f
	capped := f.MaxReplicas > r.maxReplicas
	f.MaxReplicas = min(f.MaxReplicas, r.maxReplicas)
	f.MinReplicas = min(f.MinReplicas, f.MaxReplicas)
	local := mode == string(v1alpha1.ModeLocal)
	if local {
		f.MinReplicas, f.MaxReplicas = min(f.MinReplicas, 1), 1
	}
	current := scale.Spec.Replicas
	reporting := fleet.err == nil && fleet.live > 0
	want := r.scaler.replicas(qp.Namespace+"/"+qp.Name, time.Now(), current, fleet.rate, reporting, f)
	if local {
		want = min(want, 1) // at once: the scale-down delay guards capacity, not a multiplied limit
	}
	if want != current {
		scale.Spec.Replicas = want
		if err := r.client.SubResource("scale").Update(ctx, dep, client.WithSubResourceBody(&scale)); err != nil {
			cond.Reason, cond.Message = "ScaleFailed", "setting the Deployment's replicas: "+err.Error()
			return cond, err
		}
		r.recorder.Eventf(qp, dep, "Normal", "Scaled", "Scale", "enforcer Deployment %s scaled from %d to %d replicas for %.0f decisions/s", f.DeploymentName, current, want, fleet.rate)
	}
	st.Replicas = want
	cond.Status, cond.Reason = metav1.ConditionTrue, "Scaled"
	switch {
	case local:
		cond.Reason = "LocalMode"
		cond.Message = fmt.Sprintf("%d replica (the spec asks %d..%d): in mode local each enforcer decides every request alone with the whole of every limit, so N replicas would admit up to N times each limit; set spec.mode to central or local-reconciled to scale the fleet", want, asked.MinReplicas, asked.MaxReplicas)
		if fleet.err == nil && fleet.live > 1 {
			cond.Message += fmt.Sprintf("; %d enforcers run the plane now, admitting up to %d times each limit until the others stop", fleet.live, fleet.live)
		}
	case f.TargetRatePerReplica == 0:
		cond.Message = fmt.Sprintf("%d replicas, kept within %d..%d (no targetRatePerReplica)", want, f.MinReplicas, f.MaxReplicas)
	case !reporting:
		cond.Reason = "NoReports"
		cond.Message = fmt.Sprintf("%d replicas, kept within %d..%d: no enforcer reports its decision rate", want, f.MinReplicas, f.MaxReplicas)
	default:
		cond.Message = fmt.Sprintf("%d replicas within %d..%d, sized at %d decisions/s each", want, f.MinReplicas, f.MaxReplicas, f.TargetRatePerReplica)
	}
	if capped && !local {
		cond.Message += fmt.Sprintf(" (the spec asks up to %d; the manager caps every fleet at %d: --max-enforcer-replicas)", asked.MaxReplicas, r.maxReplicas)
	}
	return cond, nil
}

// EnforcerLabel marks a Deployment as quotaplane's enforcer: the manager
// scales only a Deployment that carries it with the value "true".
const EnforcerLabel = "quotaplane.io/enforcer"

// DefaultMaxEnforcerReplicas is Options.MaxEnforcerReplicas's default.
const DefaultMaxEnforcerReplicas = 100
