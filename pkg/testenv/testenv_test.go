package testenv_test

import (
	"context"
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/quotaplane/quotaplane/api/v1alpha1"
	"github.com/quotaplane/quotaplane/pkg/testenv"
)

func TestStartInstallsTheCRDs(t *testing.T) {
	env := testenv.Start(t)
	if len(env.CRDs) != 5 {
		t.Fatalf("installed %d CRDs, want the 5 of quotaplane.io (QuotaPlane, TenantQuota, EndpointQuota, BurstPool, Upstream)", len(env.CRDs))
	}
	var list v1alpha1.QuotaPlaneList
	if err := env.Client.List(context.Background(), &list, client.InNamespace("default")); err != nil {
		t.Fatalf("list QuotaPlanes: %v", err)
	}
}
