package reload

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/quotaplane/quotaplane/pkg/enforcer"
	"github.com/quotaplane/quotaplane/pkg/policy"
	"github.com/quotaplane/quotaplane/pkg/policy/policytest"
	"github.com/quotaplane/quotaplane/pkg/poll"
	"github.com/quotaplane/quotaplane/pkg/redistest"
	"github.com/quotaplane/quotaplane/pkg/store"
)

const planeYAML = `apiVersion: quotaplane.io/v1alpha1
kind: QuotaPlane
metadata: {name: main, namespace: team}
spec:
  global: {rate: 1000000, burst: 1000000}
  tiers: [{name: std, weight: 1, tenant: {rate: 0, burst: %d}}]
`

func plane(burst int) string { return strings.Replace(planeYAML, "%d", strconv.Itoa(burst), 1) }

func newLoads() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Name: "loads"}, []string{"result"})
}

// waitCount waits until the counter for result reaches n; the loads metric
// is how a reload is observed, never a sleep.
func waitCount(t *testing.T, loads *prometheus.CounterVec, result string, n float64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for testutil.ToFloat64(loads.WithLabelValues(result)) < n {
		if time.Now().After(deadline) {
			t.Fatalf("%s loads stayed at %v, want %v", result, testutil.ToFloat64(loads.WithLabelValues(result)), n)
		}
		<-tick.C
	}
}

// admits counts how many of n unit requests of a fresh tenant pass: the
// tenant limit's burst, since it never refills.
func admits(t *testing.T, e *enforcer.Engine, tenant string, n int) int {
	t.Helper()
	var ok int
	for range n {
		d, err := e.Decide(context.Background(), enforcer.Request{Tenant: tenant, Endpoint: "x"})
		if err != nil {
			t.Fatal(err)
		}
		if d.Allow {
			ok++
		}
	}
	return ok
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// watchStore runs an engine on first whose loader watches s until ctx
// ends; it returns the engine, the loader, its load counts and its log.
func watchStore(ctx context.Context, t *testing.T, s *store.Store, first *policy.Policy) (*enforcer.Engine, *Loader, *prometheus.CounterVec, *syncBuffer) {
	t.Helper()
	e, err := enforcer.New(first)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	loads, logs := newLoads(), new(syncBuffer)
	l := New(e, policy.Overrides{}, loads, slog.New(slog.NewTextHandler(logs, nil)), first)
	go func() { _ = l.WatchStore(ctx, s) }()
	return e, l, loads, logs
}

// watchDir starts an engine on dir's policy (version 1, with o) and a
// loader watching dir, polling every interval, until the test ends.
func watchDir(t *testing.T, dir string, o policy.Overrides, every time.Duration) (*enforcer.Engine, *prometheus.CounterVec) {
	t.Helper()
	p, err := policy.LoadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	p = p.WithVersion(1)
	inForce, err := p.Override(o)
	if err != nil {
		t.Fatal(err)
	}
	e, err := enforcer.New(inForce)
	if err != nil {
		t.Fatal(err)
	}
	loads := newLoads()
	l := New(e, o, loads, quiet, p)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); l.WatchDir(ctx, dir, every) }()
	t.Cleanup(func() { cancel(); <-done; e.Close() })
	return e, loads
}

// TestWatchDir: edits of the files, a bad edit (counted, the last good
// policy kept) and the symlink swap of a mounted ConfigMap are followed.
func TestWatchDir(t *testing.T) {
	dir := t.TempDir()
	// A ConfigMap volume: files are links into ..data, itself a link to a
	// timestamped directory that an update replaces.
	write := func(name, content string) {
		ts := filepath.Join(dir, "..v"+name)
		if err := os.MkdirAll(ts, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(ts, "plane.yaml"), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		tmp := filepath.Join(dir, "..data_tmp")
		_ = os.Remove(tmp)
		if err := os.Symlink("..v"+name, tmp); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Lstat(filepath.Join(dir, "plane.yaml")); os.IsNotExist(err) {
			if err := os.Symlink("..data/plane.yaml", filepath.Join(dir, "plane.yaml")); err != nil {
				t.Fatal(err)
			}
		}
	}
	write("1", plane(5))
	e, loads := watchDir(t, dir, policy.Overrides{}, 10*time.Millisecond)

	if got := admits(t, e, "a", 10); got != 5 {
		t.Fatalf("admitted %d, want the burst of 5", got)
	}
	write("2", plane(8))
	waitCount(t, loads, "ok", 1)
	if v := e.Policy().Version(); v != 2 {
		t.Fatalf("version %d after the first reload, want 2", v)
	}
	if got := admits(t, e, "b", 10); got != 8 {
		t.Fatalf("a new tenant admitted %d after the reload, want the new burst of 8", got)
	}
	if got := admits(t, e, "a", 10); got != 0 {
		t.Fatalf("the old tenant admitted %d more, want 0: its spent bucket is kept, not refilled by the reload", got)
	}
	write("3", "apiVersion: quotaplane.io/v1alpha1\nkind: QuotaPlane\nmetadata: {name: main}\nspec: {global: {rate: -1}}\n")
	waitCount(t, loads, "error", 1)
	if v := e.Policy().Version(); v != 2 {
		t.Fatalf("a bad edit changed the policy to version %d", v)
	}
	write("4", plane(2))
	waitCount(t, loads, "ok", 2)
	if got := admits(t, e, "c", 10); got != 2 {
		t.Fatalf("admitted %d after the last reload, want 2", got)
	}
}

// TestWatchStore: a version published to Redis is loaded, a corrupt one is
// counted and skipped.
func TestWatchStore(t *testing.T) {
	srv := redistest.Start(t)
	compile := func(burst int) *policy.Policy { return policytest.Compile(t, plane(burst)) }
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s, err := store.New(srv.Client(), compile(5).ID(), store.WithPollInterval(20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Publish(ctx, compile(5)); err != nil {
		t.Fatal(err)
	}
	first, err := s.Current(ctx)
	if err != nil {
		t.Fatal(err)
	}
	e, l, loads, _ := watchStore(ctx, t, s, first)

	if _, _, err := s.Publish(ctx, compile(9)); err != nil {
		t.Fatal(err)
	}
	waitCount(t, loads, "ok", 1)
	if v := e.Policy().Version(); v != 2 {
		t.Fatalf("version %d, want 2", v)
	}
	if got := admits(t, e, "a", 20); got != 9 {
		t.Fatalf("admitted %d, want the new burst of 9", got)
	}
	// The enforcer reports the version it runs, for the manager.
	var decisions atomic.Int64
	decisions.Store(20)
	go l.Report(ctx, s, decisions.Load, 20*time.Millisecond)
	deadline := time.Now().Add(5 * time.Second)
	for {
		reports, err := s.Enforcers(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(reports) == 1 && reports[0].ID == e.NodeID() && reports[0].PolicyVersion == 2 && reports[0].Mode == e.BackendStatus().Mode.String() && !reports[0].Degraded {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("reports %+v: want this enforcer at version 2, in its mode (%s), not degraded", reports, e.BackendStatus().Mode)
		}
		<-time.After(5 * time.Millisecond)
	}
	// A corrupt version 3, written around the store.
	if err := srv.Client().HSet(ctx, store.PolicyKey(first.ID()), "current", 3, "v3", "{not json", "hash", "x").Err(); err != nil {
		t.Fatal(err)
	}
	waitCount(t, loads, "error", 1)
	if v := e.Policy().Version(); v != 2 {
		t.Fatalf("a corrupt version changed the policy to %d", v)
	}

	// Redis loses its data and the manager republishes the same content as
	// version 4: the enforcer runs and reports version 4, its buckets kept
	// (the 9 tokens of tenant a stay spent).
	if err := srv.Client().FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if v, _, err := s.Publish(ctx, compile(9), store.Above(3)); err != nil || v != 4 {
		t.Fatalf("republished as version %d (%v), want 4", v, err)
	}
	waitCount(t, loads, "ok", 2)
	if v := e.Policy().Version(); v != 4 {
		t.Fatalf("version %d after the same content was republished as version 4", v)
	}
	if got := admits(t, e, "a", 20); got != 0 {
		t.Fatalf("tenant a admitted %d after the republish, want 0: the same content keeps its buckets", got)
	}
	poll.Until(t, 5*time.Second, "the enforcer reports version 4", func() bool {
		reports, err := s.Enforcers(ctx)
		return err == nil && len(reports) == 1 && reports[0].PolicyVersion == 4
	})
}

// TestOverridesApplyToEveryLoad: the enforcer's flags override every
// policy it loads, and an unchanged source is not loaded again.
func TestOverridesApplyToEveryLoad(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "plane.yaml"), []byte(plane(5)), 0o644); err != nil {
		t.Fatal(err)
	}
	e, loads := watchDir(t, dir, policy.Overrides{GlobalPerSecond: 777, Fairness: "none"}, 5*time.Millisecond)
	if err := os.WriteFile(filepath.Join(dir, "plane.yaml"), []byte(plane(6)), 0o644); err != nil {
		t.Fatal(err)
	}
	waitCount(t, loads, "ok", 1)
	if g, f := e.Policy().Global().Rate, e.Policy().Spec().Fairness; g != 777 || f != "none" {
		t.Fatalf("after a reload the global rate is %d and fairness %s; want the overrides, 777 and none", g, f)
	}
	// Polls of an unchanged source load nothing: let some twenty pass.
	<-time.After(100 * time.Millisecond)
	if n := testutil.ToFloat64(loads.WithLabelValues("ok")); n != 1 {
		t.Fatalf("%v loads of an unchanged source, want 1", n)
	}
}

// TestWatchDirNeedsNoPoll: an edit is seen by the file watch, long before
// the next poll.
func TestWatchDirNeedsNoPoll(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "plane.yaml")
	if err := os.WriteFile(file, []byte(plane(5)), 0o644); err != nil {
		t.Fatal(err)
	}
	e, loads := watchDir(t, dir, policy.Overrides{}, time.Hour)
	// The watch may start a moment after WatchDir does: write until seen.
	deadline := time.Now().Add(10 * time.Second)
	for burst := 6; testutil.ToFloat64(loads.WithLabelValues("ok")) < 1; burst++ {
		if time.Now().After(deadline) {
			t.Fatal("an edit was not seen within 10s with an hourly poll")
		}
		if err := os.WriteFile(file, []byte(plane(burst)), 0o644); err != nil {
			t.Fatal(err)
		}
		<-time.After(100 * time.Millisecond)
	}
	if v := e.Policy().Version(); v < 2 {
		t.Fatalf("version %d after the edit, want 2 or more", v)
	}
}

// TestLoadLogNamesTheModeInForce: the "policy loaded" line named the mode
// the policy's file says, not the -mode override the enforcer runs.
func TestLoadLogNamesTheModeInForce(t *testing.T) {
	srv := redistest.Start(t)
	p := policytest.Compile(t, plane(5)) // mode local
	e, err := enforcer.New(p, enforcer.WithRedis(srv.Client()))
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	var out strings.Builder
	l := New(e, policy.Overrides{Mode: "central"}, newLoads(), slog.New(slog.NewJSONHandler(&out, nil)), nil)
	if _, err := l.Apply(p); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), `"mode":"central"`) {
		t.Fatalf("log %s; want the mode in force, central", out.String())
	}
}

// TestWatchStoreSigned: an enforcer that trusts the manager's key loads its
// signed versions; a version injected in Redis (unsigned, or a valid
// policy under a copied signature) or signed by another key is refused,
// counted as "unverified" (not "error"), logged, and the last good policy
// stays in force, admitting by its limits; the manager's next version loads.
func TestWatchStoreSigned(t *testing.T) {
	srv, manager, follower := signedStores(t)
	rdb := srv.Client()
	compile := func(burst int) *policy.Policy { return policytest.Compile(t, plane(burst)) }
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	_, attackerKey, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	id := compile(5).ID()
	if _, _, err := manager.Publish(ctx, compile(5)); err != nil {
		t.Fatal(err)
	}
	first, err := follower.Current(ctx)
	if err != nil {
		t.Fatalf("a signed version: %v", err)
	}
	e, _, loads, logs := watchStore(ctx, t, follower, first)

	if _, _, err := manager.Publish(ctx, compile(7)); err != nil {
		t.Fatal(err)
	}
	waitCount(t, loads, "ok", 1)
	if v := e.Policy().Version(); v != 2 {
		t.Fatalf("signed version 2 not loaded: running %d", v)
	}

	key := store.PolicyKey(id)
	signature := rdb.HGet(ctx, key, "sig2").Val()
	forged := compile(1000).WithVersion(3)
	if err := rdb.HSet(ctx, key, "v3", forged.Encode(), "hash", forged.Hash(), "current", 3).Err(); err != nil {
		t.Fatal(err)
	}
	waitCount(t, loads, "unverified", 1)
	forged = compile(2000).WithVersion(4)
	if err := rdb.HSet(ctx, key, "v4", forged.Encode(), "hash", forged.Hash(), "sig4", signature, "current", 4).Err(); err != nil {
		t.Fatal(err)
	}
	waitCount(t, loads, "unverified", 2)
	attacker, err := store.New(rdb, id, store.WithSigner(store.NewSigner(attackerKey)))
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := attacker.Publish(ctx, compile(3000)); err != nil {
		t.Fatal(err)
	}
	waitCount(t, loads, "unverified", 3)
	if v := e.Policy().Version(); v != 2 {
		t.Fatalf("an unverified version was loaded: running %d", v)
	}
	if got := admits(t, e, "a", 20); got != 7 {
		t.Fatalf("admitted %d, want the last good burst of 7", got)
	}
	if n := testutil.ToFloat64(loads.WithLabelValues("error")); n != 0 {
		t.Fatalf("%v unverified loads counted as errors", n)
	}
	if out := logs.String(); strings.Count(out, "policy refused: its signature does not verify") != 3 {
		t.Fatalf("want three refusals logged, got:\n%s", out)
	}

	if _, _, err := manager.Publish(ctx, compile(9)); err != nil {
		t.Fatal(err)
	}
	waitCount(t, loads, "ok", 2)
	if got := admits(t, e, "b", 20); got != 9 {
		t.Fatalf("after the manager's next version, admitted %d, want 9", got)
	}
}

// TestWatchStoreRefusesReplay: a writer to the policy hash puts back
// version 1, which the manager signed, while the enforcer runs version 2:
// refused, counted as "unverified" (with the forgeries), logged as older
// than the version in force, and version 2 stays in force, admitting by
// its limits; the manager's next version (3, above what it published)
// loads. The loader's watch starts from the version it was made with, so
// an enforcer started on version 2 refuses the replay from its first read.
// Before, a signed enforcer took the replay for a store reset and loaded
// it until the manager's next publish.
func TestWatchStoreRefusesReplay(t *testing.T) {
	srv, manager, follower := signedStores(t)
	rdb := srv.Client()
	compile := func(burst int) *policy.Policy { return policytest.Compile(t, plane(burst)) }
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	id := compile(5).ID()
	old, current := compile(1000), compile(7)
	for _, p := range []*policy.Policy{old, current} {
		if _, _, err := manager.Publish(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	first, err := follower.Current(ctx)
	if err != nil || first.Version() != 2 {
		t.Fatalf("version 2: %v, %v", first, err)
	}
	// Put back before the watch starts, after the enforcer loaded 2.
	if err := rdb.HSet(ctx, store.PolicyKey(id), "current", 1, "hash", old.Hash()).Err(); err != nil {
		t.Fatal(err)
	}
	e, _, loads, logs := watchStore(ctx, t, follower, first)

	waitCount(t, loads, "unverified", 1)
	if v := e.Policy().Version(); v != 2 {
		t.Fatalf("the replayed version was loaded: running %d", v)
	}
	if got := admits(t, e, "a", 2000); got != 7 {
		t.Fatalf("admitted %d, want version 2's burst of 7 (the replay's is 1000)", got)
	}
	if n := testutil.ToFloat64(loads.WithLabelValues("error")); n != 0 {
		t.Fatalf("%v errors counted; want the replay counted as unverified only", n)
	}
	if out := logs.String(); !strings.Contains(out, "policy refused: older than the version in force") || !strings.Contains(out, "version 1 is signed but older than version 2") {
		t.Fatalf("the refusal is not logged with its versions:\n%s", out)
	}

	if _, _, err := manager.Publish(ctx, compile(9), store.Above(2)); err != nil {
		t.Fatal(err)
	}
	waitCount(t, loads, "ok", 1)
	if v := e.Policy().Version(); v != 3 {
		t.Fatalf("the manager's next version not loaded: running %d", v)
	}
}

// syncBuffer is a bytes.Buffer safe for the watcher's goroutine.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// signedStores starts a Redis with the plane of plane() in it: a manager's
// store, signing with a new key, and a follower's, verifying that key and
// polling every 20 ms.
func signedStores(t *testing.T) (*redistest.Server, *store.Store, *store.Store) {
	t.Helper()
	srv := redistest.Start(t)
	_, managerKey, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	id := policytest.Compile(t, plane(5)).ID()
	manager, err := store.New(srv.Client(), id, store.WithSigner(store.NewSigner(managerKey)))
	if err != nil {
		t.Fatal(err)
	}
	follower, err := store.New(srv.Client(), id, store.WithPollInterval(20*time.Millisecond),
		store.WithVerifier(store.NewVerifier(managerKey.Public().(ed25519.PublicKey))))
	if err != nil {
		t.Fatal(err)
	}
	return srv, manager, follower
}
