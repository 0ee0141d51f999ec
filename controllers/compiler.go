package controllers

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/quotaplane/quotaplane/api/v1alpha1"
	"github.com/quotaplane/quotaplane/pkg/store"
)

// +kubebuilder:rbac:groups=quotaplane.io,resources=quotaplanes;tenantquotas;endpointquotas;burstpools,verbs=get;list;watch
// +kubebuilder:rbac:groups=quotaplane.io,resources=quotaplanes/status;tenantquotas/status;endpointquotas/status;burstpools/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get

// compiler compiles and publishes one namespace's plane per reconcile; its
// requests carry only the namespace.
type compiler struct {
	client client.Client
	// secrets reads the Secrets that TenantQuotas name for their api keys,
	// one Get each, past the cache: the manager may get a Secret, never
	// list or watch them, so it holds none but those in use, and a changed
	// Secret is read again at the next resync.
	secrets  client.Reader
	stores   *stores
	verdicts *verdicts
	recorder events.EventRecorder
	metrics  *managerMetrics
	// pokes wake the status controller of each kind for one object.
	pokes map[string]chan event.GenericEvent
	// resync is how often a plane is compiled and published again when
	// nothing changed.
	resync time.Duration
}

// planeRequest is the compiler's queue key for namespace ns.
func planeRequest(ns string) ctrl.Request {
	return ctrl.Request{NamespacedName: types.NamespacedName{Namespace: ns}}
}

func (c *compiler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	ns := req.Namespace
	objs, err := c.list(ctx, ns)
	if err != nil {
		return ctrl.Result{}, err
	}
	if len(objs) == 0 {
		c.verdicts.set(ns, nil)
		c.metrics.forget(ns)
		return ctrl.Result{}, nil
	}
	previous := c.verdicts.get(ns)
	if previous == nil || !previous.inForceKnown {
		// The first compile of this namespace in this process (or the
		// store could not be read before): what is in force, and the specs
		// it was compiled from, come from the store.
		restored := restore(ctx, ns, primaryPlane(objs), c.stores.get)
		if previous == nil || restored.inForceKnown {
			previous = restored
		}
	}
	// The Secrets of the specs in force too: a held TenantQuota's last
	// valid spec may name another Secret than its current one.
	specs := slices.Clip(objs)
	for _, rec := range previous.inForce {
		specs = append(specs, rec.obj)
	}
	secrets, err := c.keySecrets(ctx, ns, specs)
	if err != nil {
		return ctrl.Result{}, err
	}
	v, published, err := compilePlane(ctx, ns, append(slices.Clip(objs), secrets...), previous, c.stores.get)
	c.verdicts.set(ns, v)
	c.metrics.record(v)

	var plane client.Object
	for _, o := range objs {
		if qp, ok := o.(*v1alpha1.QuotaPlane); ok && qp.Name == v.planeName {
			plane = qp
		}
	}
	switch {
	case err != nil:
		c.metrics.publishFailures.WithLabelValues(ns).Inc()
		if plane != nil {
			c.recorder.Eventf(plane, nil, "Warning", "PublishFailed", "Publish", "publishing the policy to Redis failed, retrying: %s", v.publishErr)
		}
	case published:
		c.metrics.publishes.WithLabelValues(ns).Inc()
		log.FromContext(ctx).Info("published", "plane", ns+"/"+v.planeName, "version", v.version, "hash", v.hash)
		c.recorder.Eventf(plane, nil, "Normal", "Published", "Publish", "published policy version %d (hash %.12s)", v.version, v.hash)
	}
	if !reflect.DeepEqual(*previous, *v) {
		for _, o := range objs {
			c.pokes[kindOf(o)] <- event.GenericEvent{Object: o.(client.Object)}
		}
	}
	// An error requeues with backoff: a failed publish is retried until
	// Redis takes it. Otherwise the plane is compiled again after resync
	// even if nothing changed: Publish writes only when Redis does not hold
	// this content, so a Redis that lost its data (a restart without
	// persistence) gets the plane back within resync.
	return ctrl.Result{RequeueAfter: c.resync}, err
}

// list reads every quota object of ns from the cache.
func (c *compiler) list(ctx context.Context, ns string) ([]runtime.Object, error) {
	return ListQuotaObjects(ctx, c.client, ns)
}

// ListQuotaObjects reads every quota object of namespace ns from r (the
// manager's cache, or the API server): what the plane of ns compiles from.
func ListQuotaObjects(ctx context.Context, r client.Reader, ns string) ([]runtime.Object, error) {
	var (
		planes    v1alpha1.QuotaPlaneList
		tenants   v1alpha1.TenantQuotaList
		endpoints v1alpha1.EndpointQuotaList
		pools     v1alpha1.BurstPoolList
	)
	for _, l := range []client.ObjectList{&planes, &tenants, &endpoints, &pools} {
		if err := r.List(ctx, l, client.InNamespace(ns)); err != nil {
			return nil, fmt.Errorf("list the quota objects of namespace %s: %w", ns, err)
		}
	}
	var objs []runtime.Object
	for i := range planes.Items {
		objs = append(objs, &planes.Items[i])
	}
	for i := range tenants.Items {
		objs = append(objs, &tenants.Items[i])
	}
	for i := range endpoints.Items {
		objs = append(objs, &endpoints.Items[i])
	}
	for i := range pools.Items {
		objs = append(objs, &pools.Items[i])
	}
	return objs, nil
}

// keySecrets reads the Secrets the TenantQuotas of objs name in
// spec.keySecretRef. A Secret that is not there is left out, and Compile
// says so on the TenantQuota.
func (c *compiler) keySecrets(ctx context.Context, ns string, objs []runtime.Object) ([]runtime.Object, error) {
	var secrets []runtime.Object
	read := map[string]bool{}
	for _, o := range objs {
		tq, ok := o.(*v1alpha1.TenantQuota)
		if !ok || tq.Spec.KeySecretRef == nil || read[tq.Spec.KeySecretRef.Name] {
			continue
		}
		name := tq.Spec.KeySecretRef.Name
		read[name] = true
		var secret corev1.Secret
		switch err := c.secrets.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, &secret); {
		case apierrors.IsNotFound(err), apierrors.IsForbidden(err):
			continue
		case err != nil:
			return nil, fmt.Errorf("read Secret %s/%s, the api keys of TenantQuota %s: %w", ns, name, tq.Name, err)
		}
		secrets = append(secrets, &secret)
	}
	return secrets, nil
}

// stores keeps one policy store per plane.
type stores struct {
	redis  redis.UniversalClient
	signer *store.Signer // nil: unsigned
	mu     sync.Mutex
	m      map[string]*store.Store
}

func (s *stores) get(plane string) (*store.Store, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if st, ok := s.m[plane]; ok {
		return st, nil
	}
	var opts []store.Option
	if s.signer != nil {
		opts = append(opts, store.WithSigner(s.signer))
	}
	st, err := store.New(s.redis, plane, opts...)
	if err != nil {
		return nil, err
	}
	if s.m == nil {
		s.m = map[string]*store.Store{}
	}
	s.m[plane] = st
	return st, nil
}
