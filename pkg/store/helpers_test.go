package store_test

import (
	"context"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotaplane/quotaplane/api/v1alpha1"
	"github.com/quotaplane/quotaplane/config/samples"
	"github.com/quotaplane/quotaplane/pkg/policy"
	"github.com/quotaplane/quotaplane/pkg/store"
)

// samplePlane is the plane of config/samples, as the store names planes
// (policy.ID: namespace/name).
const samplePlane = "default/main"

// waitTimeout bounds every wait of these tests; the waits themselves end on
// a condition, usually within milliseconds.
const waitTimeout = 5 * time.Second

// never is a poll interval that does not tick within a test: what a watcher
// with it gets, it got from pub/sub.
const never = time.Hour

// samplePolicy is the sample plane with its global rate set to globalRate,
// so that different rates are different contents.
func samplePolicy(t testing.TB, globalRate int64) *policy.Policy {
	t.Helper()
	return samplePolicyOf(t, samplePlane, globalRate)
}

// samplePolicyOf is samplePolicy with the QuotaPlane renamed: plane is
// "default/<name>".
func samplePolicyOf(t testing.TB, plane string, globalRate int64) *policy.Policy {
	plane = strings.TrimPrefix(plane, "default/")
	t.Helper()
	objs, err := policy.ReadFS(samples.FS)
	if err != nil {
		t.Fatalf("read samples: %v", err)
	}
	for _, o := range objs {
		if qp, ok := o.(*v1alpha1.QuotaPlane); ok {
			qp.Name = plane
			qp.Spec.Global.Rate = globalRate
			qp.Spec.Global.Burst = 2 * globalRate
		}
	}
	p, problems := policy.Compile(objs)
	if len(problems) > 0 {
		t.Fatalf("compile the sample plane with global rate %d: %v", globalRate, problems)
	}
	return p
}

func newStore(t testing.TB, c redis.UniversalClient, opts ...store.Option) *store.Store {
	t.Helper()
	st, err := store.New(c, samplePlane, opts...)
	if err != nil {
		t.Fatalf("store.New: %v", err)
	}
	return st
}

func publish(t testing.TB, st *store.Store, p *policy.Policy) (int64, bool) {
	t.Helper()
	v, changed, err := st.Publish(context.Background(), p)
	if err != nil {
		t.Fatalf("publish content %s: %v", p.Hash()[:8], err)
	}
	return v, changed
}

// watch runs st.Watch until the test ends, recording what it delivers and
// reports.
type watch struct {
	policies chan *policy.Policy
	errs     chan error
	cancel   context.CancelFunc
	done     chan struct{} // closed when Watch has returned
	err      error         // Watch's result, set before done is closed
}

func startWatch(t testing.TB, st *store.Store, opts ...store.WatchOption) *watch {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	w := &watch{
		policies: make(chan *policy.Policy, 64),
		errs:     make(chan error, 64),
		cancel:   cancel,
		done:     make(chan struct{}),
	}
	go func() {
		defer close(w.done)
		w.err = st.Watch(ctx, func(p *policy.Policy) { w.policies <- p }, func(err error) {
			select {
			case w.errs <- err:
			default: // the tests read the first few; more would block the watcher
			}
		}, opts...)
	}()
	t.Cleanup(func() { _ = w.stop(t) })
	return w
}

// stop ends the Watch and waits for it to return; it returns what Watch
// returned.
func (w *watch) stop(t testing.TB) error {
	t.Helper()
	w.cancel()
	select {
	case <-w.done:
		return w.err
	case <-time.After(waitTimeout):
		t.Fatalf("Watch did not return within %s of its context ending", waitTimeout)
		return nil
	}
}

// next is the next delivered policy.
func (w *watch) next(t testing.TB) *policy.Policy {
	t.Helper()
	select {
	case p := <-w.policies:
		return p
	case <-w.done:
		t.Fatalf("Watch returned %v before delivering", w.err)
	case <-time.After(waitTimeout):
		t.Fatalf("no policy delivered within %s", waitTimeout)
	}
	return nil
}

// expect checks that the next delivered policy is version with content hash.
func (w *watch) expect(t testing.TB, version int64, hash string) {
	t.Helper()
	p := w.next(t)
	if p.Version() != version || p.Hash() != hash {
		t.Fatalf("delivered version %d content %s, want version %d content %s", p.Version(), p.Hash()[:8], version, hash[:8])
	}
}

// nextError is the next reported error that matches want.
func (w *watch) nextError(t testing.TB, want func(error) bool) error {
	t.Helper()
	deadline := time.After(waitTimeout)
	for {
		select {
		case err := <-w.errs:
			if want(err) {
				return err
			}
		case <-deadline:
			t.Fatalf("no matching error reported within %s", waitTimeout)
			return nil
		}
	}
}

// nothingDelivered checks that no policy is waiting in the watch's channel.
func (w *watch) nothingDelivered(t testing.TB) {
	t.Helper()
	select {
	case p := <-w.policies:
		t.Fatalf("unexpected delivery of version %d content %s", p.Version(), p.Hash()[:8])
	default:
	}
}

// checkNoLeak checks, once the cleanups registered after it have run (those
// of the watches it should cover), that no more goroutines run than when it
// was called.
func checkNoLeak(t *testing.T) {
	t.Helper()
	before := runtime.NumGoroutine()
	t.Cleanup(func() {
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		deadline := time.After(waitTimeout)
		for runtime.NumGoroutine() > before {
			select {
			case <-tick.C:
			case <-deadline:
				buf := make([]byte, 1<<20)
				t.Fatalf("%d goroutines run, %d did before the watch:\n%s", runtime.NumGoroutine(), before, buf[:runtime.Stack(buf, true)])
			}
		}
	})
}
