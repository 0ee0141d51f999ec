package controllers

import (
	"context"
	"fmt"
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

// ConditionScaled is the QuotaPlane condition that says whether the manager
// sizes the enforcer Deployment.
const ConditionScaled = "Scaled"

// planeReconciler owns the QuotaPlane's status: Ready like every quota
// object, plus the published version, the enforcers that run it, and the
// enforcer fleet's size, which it sets. It runs again every interval to
// follow the enforcers' reports.
type planeReconciler struct {
	client   client.Client
	stores   *stores
	verdicts *verdicts
	recorder events.EventRecorder
	scaler   *scaler
	interval time.Duration
}

func (r *planeReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var qp v1alpha1.QuotaPlane
	if err := r.client.Get(ctx, req.NamespacedName, &qp); err != nil {
		if apierrors.IsNotFound(err) {
			r.scaler.forget(req.Namespace)
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
	var scaleErr error
	if v.publishedPlane == qp.Name && v.version > 0 {
		st.PublishedVersion, st.PublishedHash = v.version, v.hash
		rate, reporting := r.readReports(ctx, &qp, v.version, &st)
		if v.fleet.DeploymentName != "" {
			var cond metav1.Condition
			cond, scaleErr = r.scale(ctx, &qp, v.fleet, rate, reporting, &st)
			meta.SetStatusCondition(&st.Conditions, cond)
		}
	}
	if err := writeStatus(ctx, r.client, r.recorder, &qp, &qp.Status, &st, func() { qp.Status = st }); err != nil {
		return next, err
	}
	return next, scaleErr
}

// readReports sets enforcersReady from the enforcers' reports in Redis and
// returns the fleet's decision rate; reporting is false when no enforcer
// reports (or Redis cannot say), and enforcersReady is then left alone.
func (r *planeReconciler) readReports(ctx context.Context, qp *v1alpha1.QuotaPlane, version int64, st *v1alpha1.QuotaPlaneStatus) (rate float64, reporting bool) {
	s, err := r.stores.get(qp.Namespace + "/" + qp.Name)
	if err == nil {
		reports, err := s.Enforcers(ctx)
		if err == nil {
			st.EnforcersReady = 0
			for _, rep := range reports {
				rate += rep.DecisionsPerSec
				if rep.PolicyVersion == version {
					st.EnforcersReady++
				}
			}
			return rate, len(reports) > 0
		}
	}
	log.FromContext(ctx).Info("enforcer reports unreadable; enforcersReady and the fleet's size are kept", "err", err)
	return 0, false
}

// scale sizes the enforcer Deployment of f through its scale subresource.
func (r *planeReconciler) scale(ctx context.Context, qp *v1alpha1.QuotaPlane, f policy.Enforcer, rate float64, reporting bool, st *v1alpha1.QuotaPlaneStatus) (metav1.Condition, error) {
	cond := metav1.Condition{Type: ConditionScaled, Status: metav1.ConditionFalse, ObservedGeneration: qp.Generation}
	dep := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: qp.Namespace, Name: f.DeploymentName}}
	var scale autoscalingv1.Scale
	if err := r.client.SubResource("scale").Get(ctx, dep, &scale); err != nil {
		if apierrors.IsNotFound(err) {
			cond.Reason = "DeploymentNotFound"
			cond.Message = fmt.Sprintf("Deployment %s/%s does not exist: create the enforcer Deployment or fix spec.enforcer.deploymentName", qp.Namespace, f.DeploymentName)
			return cond, nil
		}
		cond.Reason, cond.Message = "ScaleFailed", "reading the Deployment's scale: "+err.Error()
		return cond, err
	}
	current := scale.Spec.Replicas
	want := r.scaler.replicas(qp.Namespace, time.Now(), current, rate, reporting, f)
	if want != current {
		scale.Spec.Replicas = want
		if err := r.client.SubResource("scale").Update(ctx, dep, client.WithSubResourceBody(&scale)); err != nil {
			cond.Reason, cond.Message = "ScaleFailed", "setting the Deployment's replicas: "+err.Error()
			return cond, err
		}
		r.recorder.Eventf(qp, dep, "Normal", "Scaled", "Scale", "enforcer Deployment %s scaled from %d to %d replicas for %.0f decisions/s", f.DeploymentName, current, want, rate)
	}
	st.Replicas = want
	cond.Status, cond.Reason = metav1.ConditionTrue, "Scaled"
	switch {
	case f.TargetRatePerReplica == 0:
		cond.Message = fmt.Sprintf("%d replicas, kept within %d..%d (no targetRatePerReplica)", want, f.MinReplicas, f.MaxReplicas)
	case !reporting:
		cond.Reason = "NoReports"
		cond.Message = fmt.Sprintf("%d replicas, kept within %d..%d: no enforcer reports its decision rate", want, f.MinReplicas, f.MaxReplicas)
	default:
		cond.Message = fmt.Sprintf("%d replicas within %d..%d, sized at %d decisions/s each", want, f.MinReplicas, f.MaxReplicas, f.TargetRatePerReplica)
	}
	return cond, nil
}
