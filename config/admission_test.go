package config_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/quotaplane/quotaplane/api/v1alpha1"
	"github.com/quotaplane/quotaplane/pkg/poll"
	"github.com/quotaplane/quotaplane/pkg/testenv"
)

// TestTenantTierAdmission applies the ValidatingAdmissionPolicy and its
// binding as shipped in config/admission to a real API server and checks
// that a TenantQuota naming a tier its namespace's QuotaPlane does not
// define is refused, with a message naming the tiers, and that what the
// policy lets through on purpose gets through.
func TestTenantTierAdmission(t *testing.T) {
	env := testenv.Start(t)
	ctx := context.Background()
	dir := filepath.Join(testenv.Root(), "config", "admission")
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	applied := 0
	for _, name := range files {
		if filepath.Base(name) == "kustomization.yaml" {
			continue
		}
		f, err := os.Open(name)
		if err != nil {
			t.Fatal(err)
		}
		objs, err := decodeAll(f)
		f.Close()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		for _, u := range objs {
			if err := env.Client.Create(ctx, u, client.FieldValidation(metav1.FieldValidationStrict)); err != nil {
				t.Fatalf("%s: %s: the API server rejected it: %v", name, describe(u), err)
			}
			applied++
		}
	}
	if applied != 2 {
		t.Fatalf("config/admission holds %d objects; want the policy and its binding", applied)
	}

	for _, ns := range []string{"team-a", "no-plane"} {
		if err := env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			t.Fatal(err)
		}
	}
	plane := &v1alpha1.QuotaPlane{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "main"},
		Spec: v1alpha1.QuotaPlaneSpec{Global: v1alpha1.Limit{Rate: 1000}, DefaultTier: "free",
			Tiers: []v1alpha1.Tier{{Name: "gold", Weight: 4}, {Name: "standard", Weight: 2}, {Name: "free", Weight: 1}}}}
	if err := env.Client.Create(ctx, plane); err != nil {
		t.Fatal(err)
	}
	tenant := func(ns, name, tier string) *v1alpha1.TenantQuota {
		return &v1alpha1.TenantQuota{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: v1alpha1.TenantQuotaSpec{Tenant: name, Tier: tier}}
	}

	// The policy takes effect a moment after it is created: retry until
	// the typo is refused (deleting what got in meanwhile).
	var refusal error
	poll.Until(t, 30*time.Second, "a TenantQuota with tier standrd is refused", func() bool {
		refusal = env.Client.Create(ctx, tenant("team-a", "acme", "standrd"))
		if refusal == nil {
			if err := env.Client.Delete(ctx, tenant("team-a", "acme", "")); err != nil {
				t.Fatal(err)
			}
			return false
		}
		return true
	})
	if !apierrors.IsInvalid(refusal) && !apierrors.IsForbidden(refusal) {
		t.Errorf("the refusal is %v; want Invalid or Forbidden", refusal)
	}
	for _, want := range []string{"quotaplane-tenant-tier", "tier standrd is not one of the tiers of QuotaPlane main (gold, standard, free)"} {
		if !strings.Contains(refusal.Error(), want) {
			t.Errorf("the refusal %q does not say %q", refusal, want)
		}
	}

	// Tiers the plane defines, and no tier, get in.
	acme := tenant("team-a", "acme", "standard")
	for _, tq := range []*v1alpha1.TenantQuota{acme, tenant("team-a", "globex", "gold"), tenant("team-a", "initech", "")} {
		if err := env.Client.Create(ctx, tq); err != nil {
			t.Errorf("TenantQuota %s with tier %q: %v", tq.Name, tq.Spec.Tier, err)
		}
	}
	// An update to an unknown tier is refused too.
	bad := acme.DeepCopy()
	bad.Spec.Tier = "platinum"
	if err := env.Client.Update(ctx, bad); err == nil || !strings.Contains(err.Error(), "tier platinum is not one of the tiers") {
		t.Errorf("an update to tier platinum: %v; want it refused", err)
	}
	// No QuotaPlane in the namespace: nothing to check against.
	if err := env.Client.Create(ctx, tenant("no-plane", "early", "anything")); err != nil {
		t.Errorf("a TenantQuota in a namespace without a QuotaPlane: %v; want it admitted (the manager reports it)", err)
	}

	// The plane drops standard: acme's other edits still get in while its
	// tier is unchanged, and a move to a tier the plane defines does.
	plane.Spec.Tiers = []v1alpha1.Tier{{Name: "gold", Weight: 4}, {Name: "free", Weight: 1}}
	if err := env.Client.Update(ctx, plane); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(acme), acme); err != nil {
		t.Fatal(err)
	}
	acme.Spec.Limit = &v1alpha1.Limit{Rate: 10}
	if err := env.Client.Update(ctx, acme); err != nil {
		t.Errorf("an edit leaving tier standard as it was, after the plane dropped it: %v; want it admitted", err)
	}
	newcomer := tenant("team-a", "newco", "standard")
	poll.Until(t, 10*time.Second, "a new tenant of the dropped tier is refused", func() bool {
		err := env.Client.Create(ctx, newcomer.DeepCopy())
		if err == nil {
			_ = env.Client.Delete(ctx, newcomer.DeepCopy())
			return false
		}
		return strings.Contains(err.Error(), "(gold, free)")
	})
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(acme), acme); err != nil {
		t.Fatal(err)
	}
	acme.Spec.Tier = "gold"
	if err := env.Client.Update(ctx, acme); err != nil {
		t.Errorf("moving acme to gold: %v", err)
	}
}
