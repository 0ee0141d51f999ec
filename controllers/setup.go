package controllers

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/quotaplane/quotaplane/api/v1alpha1"
	"github.com/quotaplane/quotaplane/pkg/store"
)

// Options configure the manager's controllers.
type Options struct {
	// Redis holds the policy store and the enforcers' reports. Required.
	Redis redis.UniversalClient
	// FleetInterval is how often each QuotaPlane's enforcer reports are read
	// and its fleet resized. Default 5s.
	FleetInterval time.Duration
	// ScaleDownDelay is how long a lower replica count must be recommended
	// before the fleet shrinks. Default 5m.
	ScaleDownDelay time.Duration
	// Registerer takes the manager's metrics. Default the registry
	// controller-runtime serves on its metrics endpoint.
	Registerer prometheus.Registerer
	// Resync is how often each plane is compiled and published again when
	// none of its objects changed, so that a Redis that lost its data gets
	// the plane back. Default 10s.
	Resync time.Duration
	// Upstream tunes the upstream leaders (seed 004's pipeline, one per
	// plane that has Upstreams); the zero value is the default.
	Upstream UpstreamOptions
	// MaxEnforcerReplicas caps every plane's enforcer fleet, whatever its
	// spec asks. Default 100.
	MaxEnforcerReplicas int32
	// PolicySigner, when set, signs every version published (package
	// store, Signatures); nil publishes unsigned.
	PolicySigner *store.Signer
}

// maxRetryDelay bounds the backoff of a failing reconcile (controller-runtime's
// default grows to 16 minutes): a publish that failed while Redis was away is
// retried within this long of its return.
const maxRetryDelay = 10 * time.Second

func retries() controller.Options {
	return controller.Options{RateLimiter: workqueue.NewTypedItemExponentialFailureRateLimiter[reconcile.Request](10*time.Millisecond, maxRetryDelay)}
}

// NewScheme knows the built-in kinds and quotaplane.io/v1alpha1.
func NewScheme() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	utilruntime.Must(v1alpha1.AddToScheme(s))
	return s
}

// EventSource names the manager in the Events it records.
const EventSource = "quotaplane.io/manager"

// Setup adds the compiler, the four status controllers and the upstream
// leaders to mgr.
func Setup(mgr ctrl.Manager, o Options) error {
	if o.Redis == nil {
		return errors.New("controllers: no Redis client: the manager publishes policies to Redis")
	}
	if o.FleetInterval <= 0 {
		o.FleetInterval = 5 * time.Second
	}
	if o.ScaleDownDelay <= 0 {
		o.ScaleDownDelay = 5 * time.Minute
	}
	if o.Registerer == nil {
		o.Registerer = ctrlmetrics.Registry
	}
	if o.Resync <= 0 {
		o.Resync = 10 * time.Second
	}
	if o.Upstream.Interval <= 0 {
		o.Upstream.Interval = 2 * time.Second
	}
	metrics, err := newManagerMetrics(o.Registerer)
	if err != nil {
		return err
	}
	upstreamMetrics, err := newUpstreamMetrics(o.Registerer)
	if err != nil {
		return err
	}
	var (
		c        = mgr.GetClient()
		recorder = mgr.GetEventRecorder(EventSource)
		vs       = &verdicts{}
		st       = &stores{redis: o.Redis, signer: o.PolicySigner}
		pokes    = map[string]chan event.GenericEvent{}
	)
	kinds := []struct {
		kind   string
		object func() client.Object
	}{
		{"QuotaPlane", func() client.Object { return &v1alpha1.QuotaPlane{} }},
		{"TenantQuota", func() client.Object { return &v1alpha1.TenantQuota{} }},
		{"EndpointQuota", func() client.Object { return &v1alpha1.EndpointQuota{} }},
		{"BurstPool", func() client.Object { return &v1alpha1.BurstPool{} }},
	}

	// The compiler: every quota object maps to its namespace's key.
	byNamespace := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []ctrl.Request {
		return []ctrl.Request{planeRequest(o.GetNamespace())}
	})
	b := ctrl.NewControllerManagedBy(mgr).Named("plane-compiler").WithOptions(retries())
	for _, k := range kinds {
		pokes[k.kind] = make(chan event.GenericEvent, 1024)
		b = b.Watches(k.object(), byNamespace)
	}
	if err := b.Complete(&compiler{client: c, secrets: mgr.GetAPIReader(), stores: st, verdicts: vs, recorder: recorder, metrics: metrics, pokes: pokes, resync: o.Resync}); err != nil {
		return err
	}

	// The status controllers, woken by their objects and by the compiler.
	for _, k := range kinds {
		var r reconcile.Reconciler
		if k.kind == "QuotaPlane" {
			r = &planeReconciler{client: c, reader: mgr.GetAPIReader(), stores: st, verdicts: vs, recorder: recorder,
				scaler: &scaler{delay: o.ScaleDownDelay}, interval: o.FleetInterval, maxReplicas: cmp.Or(o.MaxEnforcerReplicas, DefaultMaxEnforcerReplicas)}
		} else {
			r = &statusReconciler{client: c, verdicts: vs, recorder: recorder, kind: k.kind, newObject: k.object}
		}
		err := ctrl.NewControllerManagedBy(mgr).
			Named(k.kind + "-status").
			WithOptions(retries()).
			For(k.object()).
			WatchesRawSource(source.Channel(pokes[k.kind], &handler.EnqueueRequestForObject{})).
			Complete(r)
		if err != nil {
			return err
		}
	}

	// The upstream leaders: a runnable, which mgr.Add runs on the elected
	// manager only (leader election is the default for a runnable).
	return mgr.Add(&upstreamLeaders{client: c, reader: mgr.GetAPIReader(), stores: st, redis: o.Redis, recorder: recorder,
		metrics: upstreamMetrics, logger: slog.New(logr.ToSlogHandler(mgr.GetLogger().WithName("upstream"))), opts: o.Upstream})
}
