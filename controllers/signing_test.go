package controllers

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/quotaplane/quotaplane/api/v1alpha1"
	"github.com/quotaplane/quotaplane/pkg/poll"
	"github.com/quotaplane/quotaplane/pkg/redistest"
	"github.com/quotaplane/quotaplane/pkg/store"
	"github.com/quotaplane/quotaplane/pkg/testenv"
)

// TestManagerSignsPolicies: a manager with a PolicySigner (cmd/manager's
// -policy-signing-key-file) publishes versions that a store trusting its
// public key verifies, and that one trusting another key refuses.
func TestManagerSignsPolicies(t *testing.T) {
	env := testenv.Start(t)
	r := redistest.Start(t)
	public, private, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	other, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{
		Scheme:                 NewScheme(),
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Controller:             config.Controller{SkipNameValidation: ptr.To(true)},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := Setup(mgr, Options{Redis: r.Client(), Resync: time.Second, Registerer: prometheus.NewRegistry(), PolicySigner: store.NewSigner(private)}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	ns := namespace(t, env, "signed")
	create(t, env, samples(t, ns))
	plane := &v1alpha1.QuotaPlane{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "main"}}
	poll.Until(t, 20*time.Second, "the plane is published", func() bool {
		get(t, env, plane)
		return plane.Status.PublishedVersion > 0
	})
	trusting, err := store.New(r.Client(), ns+"/main", store.WithVerifier(store.NewVerifier(public)))
	if err != nil {
		t.Fatal(err)
	}
	if p, err := trusting.Current(ctx); err != nil || p.Version() < 1 {
		t.Fatalf("the manager's version does not verify with its key: %v, %v", p, err)
	}
	stranger, err := store.New(r.Client(), ns+"/main", store.WithVerifier(store.NewVerifier(other)))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stranger.Current(ctx); !errors.Is(err, store.ErrUnverified) {
		t.Fatalf("a store trusting another key: %v, want ErrUnverified", err)
	}
}
