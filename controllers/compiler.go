package controllers

import (
	"context"
	"fmt"
	"reflect"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
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

// compiler compiles and publishes one namespace's plane per reconcile; its
// requests carry only the namespace.
type compiler struct {
	client   client.Client
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
	v, published, err := compilePlane(ctx, ns, objs, previous, c.stores.get)
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
	if previous == nil || !reflect.DeepEqual(*previous, *v) {
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
	var (
		planes    v1alpha1.QuotaPlaneList
		tenants   v1alpha1.TenantQuotaList
		endpoints v1alpha1.EndpointQuotaList
		pools     v1alpha1.BurstPoolList
	)
	for _, l := range []client.ObjectList{&planes, &tenants, &endpoints, &pools} {
		if err := c.client.List(ctx, l, client.InNamespace(ns)); err != nil {
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

// stores keeps one policy store per plane.
type stores struct {
	redis redis.UniversalClient
	mu    sync.Mutex
	m     map[string]*store.Store
}

func (s *stores) get(plane string) (*store.Store, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if st, ok := s.m[plane]; ok {
		return st, nil
	}
	st, err := store.New(s.redis, plane)
	if err != nil {
		return nil, err
	}
	if s.m == nil {
		s.m = map[string]*store.Store{}
	}
	s.m[plane] = st
	return st, nil
}
