package controllers

import (
	"context"
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/quotaplane/quotaplane/api/v1alpha1"
)

// Reasons of the Ready condition.
const (
	// ReasonPublished: the object is in the published policy.
	ReasonPublished = "Published"
	// ReasonInvalid: the object has problems and is left out; the message lists them.
	ReasonInvalid = "Invalid"
	// ReasonPlaneInvalid: the plane as a whole does not compile; the last
	// good version stays in force.
	ReasonPlaneInvalid = "PlaneInvalid"
	// ReasonPublishFailed: the plane compiled but Redis did not take it; the
	// manager retries with backoff.
	ReasonPublishFailed = "PublishFailed"
	// ReasonHeld: the object's current generation does not compile (or, for
	// a QuotaPlane, would take objects in force out of the policy), and its
	// last valid generation stays in force in its place; the message says
	// what to fix.
	ReasonHeld = "Held"
	// ReasonDuplicate: a QuotaPlane that is not its namespace's plane (a
	// namespace holds one; the oldest is in force). It is not compiled.
	ReasonDuplicate = "Duplicate"
)

// maxMessage bounds a condition's message (the API allows 32768 bytes).
const maxMessage = 4096

// desiredStatus is the status obj (of kind) should have by the verdict v,
// starting from its current status old. It is false when v does not cover
// obj's current generation: a compile of it is queued and will poke again.
func desiredStatus(v *verdict, kind string, obj client.Object, old *v1alpha1.QuotaStatus) (v1alpha1.QuotaStatus, bool) {
	if v == nil {
		return *old, false
	}
	c, ok := v.objects[objectKey{kind, obj.GetName()}]
	if !ok || c.generation != obj.GetGeneration() {
		return *old, false
	}
	st := *old.DeepCopy()
	st.ObservedGeneration = obj.GetGeneration()
	cond := metav1.Condition{Type: v1alpha1.ConditionReady, Status: metav1.ConditionFalse, ObservedGeneration: obj.GetGeneration()}
	inForce := "nothing is published yet"
	if v.version > 0 {
		inForce = fmt.Sprintf("version %d stays in force", v.version)
	}
	inPolicy := v.version > 0 && v.publishedPlane == v.planeName
	switch {
	case c.duplicateOf != "":
		cond.Reason = ReasonDuplicate
		cond.Message = fmt.Sprintf("QuotaPlane %s is this namespace's plane (the oldest) and stays in force; this one is not compiled: a namespace holds one QuotaPlane, so delete this one or move what it should change into %s", c.duplicateOf, c.duplicateOf)
		st.PolicyVersion = 0
	case c.held > 0 && len(c.orphans) > 0:
		cond.Reason = ReasonHeld
		cond.Message = fmt.Sprintf("this edit would take objects in force out of the policy: %s; change them to fit it first; the last valid version (generation %d) stays in force until then", strings.Join(c.orphans, ", "), c.held)
		if inPolicy {
			st.PolicyVersion = v.version
		}
	case c.held > 0:
		cond.Reason = ReasonHeld
		cond.Message = fmt.Sprintf("%s; the last valid version (generation %d) stays in force until this is fixed", strings.Join(c.problems, "; "), c.held)
		if inPolicy {
			st.PolicyVersion = v.version
		}
	case len(c.problems) > 0:
		// Left out of the policy, so no version includes it.
		cond.Reason = ReasonInvalid
		cond.Message = "left out of the policy until fixed: " + strings.Join(c.problems, "; ")
		st.PolicyVersion = 0
	case len(v.planeProblems) > 0:
		// Nothing new is published; policyVersion keeps naming the version
		// in force.
		cond.Reason = ReasonPlaneInvalid
		cond.Message = "the plane does not compile, so nothing new is published (" + inForce + "): " + strings.Join(v.planeProblems, "; ")
	case v.publishErr != "":
		cond.Reason = ReasonPublishFailed
		cond.Message = "compiled, but publishing to Redis failed and is retried (" + inForce + "): " + v.publishErr
	default:
		cond.Status = metav1.ConditionTrue
		cond.Reason = ReasonPublished
		cond.Message = fmt.Sprintf("in force in policy version %d (hash %.12s)", v.version, v.hash)
		st.PolicyVersion = v.version
	}
	if len(cond.Message) > maxMessage {
		cond.Message = cond.Message[:maxMessage-3] + "..."
	}
	meta.SetStatusCondition(&st.Conditions, cond)
	return st, true
}

// statusReconciler owns the status of one kind of quota object other than
// QuotaPlane (planeReconciler owns that one).
type statusReconciler struct {
	client    client.Client
	verdicts  *verdicts
	recorder  events.EventRecorder
	kind      string
	newObject func() client.Object
}

func (r *statusReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	obj := r.newObject()
	if err := r.client.Get(ctx, req.NamespacedName, obj); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	old := statusOf(obj)
	st, ok := desiredStatus(r.verdicts.get(req.Namespace), r.kind, obj, old)
	if !ok {
		return ctrl.Result{}, nil
	}
	return ctrl.Result{}, writeStatus(ctx, r.client, r.recorder, obj, old, &st, func() { *statusOf(obj) = st })
}

// writeStatus writes obj's status when it differs from old (set stores the
// new one into obj), and records an Event when the object was just rejected.
func writeStatus[S any](ctx context.Context, c client.Client, rec events.EventRecorder, obj client.Object, old, st *S, set func()) error {
	if equality.Semantic.DeepEqual(old, st) {
		return nil
	}
	before := obj.DeepCopyObject().(client.Object)
	_, wasRejected := rejection(statusOf(before).Conditions)
	set()
	if err := c.Status().Patch(ctx, obj, client.MergeFrom(before)); err != nil {
		return fmt.Errorf("write the status of %s/%s: %w", obj.GetNamespace(), obj.GetName(), err)
	}
	if reason, msg := rejection(statusOf(obj).Conditions); msg != "" && msg != wasRejected {
		rec.Eventf(obj, nil, "Warning", reason, "Compile", "%s", msg)
	}
	return nil
}

// rejection is the Event reason and message of a Ready condition that
// refuses the object's current generation (reason Invalid or Duplicate:
// Rejected; Held: Held), or "".
func rejection(conds []metav1.Condition) (reason, message string) {
	c := meta.FindStatusCondition(conds, v1alpha1.ConditionReady)
	switch {
	case c == nil:
		return "", ""
	case c.Reason == ReasonInvalid, c.Reason == ReasonDuplicate:
		return "Rejected", c.Message
	case c.Reason == ReasonHeld:
		return "Held", c.Message
	}
	return "", ""
}

// statusOf is the QuotaStatus of a quota object (nil for other kinds).
func statusOf(obj client.Object) *v1alpha1.QuotaStatus {
	switch o := obj.(type) {
	case *v1alpha1.QuotaPlane:
		return &o.Status.QuotaStatus
	case *v1alpha1.TenantQuota:
		return &o.Status
	case *v1alpha1.EndpointQuota:
		return &o.Status
	case *v1alpha1.BurstPool:
		return &o.Status
	}
	return nil
}
