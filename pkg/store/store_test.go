package store_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/quotaplane/quotaplane/pkg/lua"
	"github.com/quotaplane/quotaplane/pkg/policy"
	"github.com/quotaplane/quotaplane/pkg/redistest"
	"github.com/quotaplane/quotaplane/pkg/store"
)

var key = store.PolicyKey(samplePlane)

func TestPolicyKey(t *testing.T) {
	if got, want := store.PolicyKey("main"), "qp:{main}:policy"; got != want {
		t.Fatalf("PolicyKey(main) = %q, want %q", got, want)
	}
}

func TestNewRejectsBadArguments(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never dialled
	defer c.Close()
	for _, tc := range []struct {
		name  string
		plane string
		opts  []store.Option
		want  string
	}{
		{"empty plane", "", nil, "plane name is empty"},
		{"open brace", "a{b", nil, `"a{b": it must not contain '{' or '}'`},
		{"close brace", "a}", nil, `"a}": it must not contain '{' or '}'`},
		{"keep zero", "main", []store.Option{store.WithKeep(0)}, "keep 0 versions: keep at least 1"},
		{"poll zero", "main", []store.Option{store.WithPollInterval(0)}, "poll interval 0s: it must be positive"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := store.New(c, tc.plane, tc.opts...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New(%q) = %v, want an error containing %q", tc.plane, err, tc.want)
			}
			if tc.opts == nil && !errors.Is(err, store.ErrInvalidPlane) {
				t.Fatalf("New(%q) = %v, want ErrInvalidPlane", tc.plane, err)
			}
		})
	}
	if _, err := store.New(nil, "main"); err == nil {
		t.Fatal("New(nil client) succeeded")
	}
}

func TestPublishCurrentRoundTrip(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	ctx := context.Background()
	st := newStore(t, c)

	if _, err := st.Current(ctx); !errors.Is(err, store.ErrNoPolicy) {
		t.Fatalf("Current of an empty store = %v, want ErrNoPolicy", err)
	}
	p := samplePolicy(t, 10000)
	if v, changed := publish(t, st, p); v != 1 || !changed {
		t.Fatalf("first Publish = (%d, %v), want (1, true)", v, changed)
	}
	got, err := st.Current(ctx)
	if err != nil {
		t.Fatalf("Current: %v", err)
	}
	if got.Version() != 1 || got.Hash() != p.Hash() {
		t.Fatalf("Current = version %d content %s, want version 1 content %s", got.Version(), got.Hash(), p.Hash())
	}
	if !bytes.Equal(got.Encode(), p.WithVersion(1).Encode()) {
		t.Fatalf("Current encodes as\n%s\nwant\n%s", got.Encode(), p.WithVersion(1).Encode())
	}
	// The layout the package doc promises.
	fields, err := c.HGetAll(ctx, key).Result()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"current": "1", "hash": p.Hash(), "v1": string(p.WithVersion(1).Encode())}
	if len(fields) != len(want) {
		t.Fatalf("%s has fields %v, want %v", key, slices.Sorted(mapKeys(fields)), slices.Sorted(mapKeys(want)))
	}
	for f, v := range want {
		if fields[f] != v {
			t.Fatalf("%s field %s = %q, want %q", key, f, fields[f], v)
		}
	}
	// A second store (another process) reads the same.
	other, err := newStore(t, c).Current(ctx)
	if err != nil || other.Hash() != p.Hash() || other.Version() != 1 {
		t.Fatalf("another Store's Current = %v, %v", other, err)
	}
}

func mapKeys(m map[string]string) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// TestPublishSameContentChangesNothing also checks, through a subscriber,
// that only stored versions are announced.
func TestPublishSameContentChangesNothing(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	ctx := context.Background()
	sub := c.Subscribe(ctx, key)
	defer sub.Close()
	if _, err := sub.Receive(ctx); err != nil { // the subscription's confirmation
		t.Fatal(err)
	}

	a, b := samplePolicy(t, 10000), samplePolicy(t, 20000)
	st := newStore(t, c)
	publish(t, st, a)
	for _, tc := range []struct {
		name string
		st   *store.Store
		p    *policy.Policy
	}{
		{"same store", st, a},
		{"another store", newStore(t, c), a},                                // no cached version
		{"a policy with its own version", newStore(t, c), a.WithVersion(7)}, // ignored
	} {
		if v, changed := publish(t, tc.st, tc.p); v != 1 || changed {
			t.Fatalf("%s: republishing = (%d, %v), want (1, false)", tc.name, v, changed)
		}
	}
	if v, changed := publish(t, st, b); v != 2 || !changed {
		t.Fatalf("publishing new content = (%d, %v), want (2, true)", v, changed)
	}
	for _, want := range []string{"1", "2"} { // no notice between 1 and 2
		msg, err := sub.ReceiveMessage(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if msg.Channel != key || msg.Payload != want {
			t.Fatalf("notice %s %q, want %s %q", msg.Channel, msg.Payload, key, want)
		}
	}
}

func TestPublishNewContentIsNextVersion(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	st := newStore(t, srv.Client())
	a, b := samplePolicy(t, 10000), samplePolicy(t, 20000)
	for i, tc := range []struct {
		p    string
		want int64
	}{{"a", 1}, {"b", 2}, {"a", 3}, {"a", 3}, {"b", 4}} {
		p := a
		if tc.p == "b" {
			p = b
		}
		v, _ := publish(t, st, p)
		if v != tc.want {
			t.Fatalf("publish %d (content %s) = version %d, want %d", i, tc.p, v, tc.want)
		}
		cur, err := st.Current(ctx)
		if err != nil || cur.Version() != tc.want || cur.Hash() != p.Hash() {
			t.Fatalf("after publish %d: Current = %v, %v; want version %d content %s", i, cur, err, tc.want, tc.p)
		}
	}
}

func TestPublishKeepsLastVersions(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	ctx := context.Background()
	st := newStore(t, c, store.WithKeep(3))
	var hashes []string
	for i := range 6 {
		p := samplePolicy(t, int64(1000+i))
		publish(t, st, p)
		hashes = append(hashes, p.Hash())
	}
	fieldsAre := func(want ...string) {
		t.Helper()
		got, err := c.HKeys(ctx, key).Result()
		if err != nil {
			t.Fatal(err)
		}
		slices.Sort(got)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Fatalf("%s has fields %v, want %v", key, got, want)
		}
	}
	fieldsAre("current", "hash", "v4", "v5", "v6")
	for v := int64(1); v <= 6; v++ {
		p, err := st.Get(ctx, v)
		if v <= 3 {
			if !errors.Is(err, store.ErrNoVersion) {
				t.Fatalf("Get(%d) = %v, want ErrNoVersion", v, err)
			}
			continue
		}
		if err != nil || p.Version() != v || p.Hash() != hashes[v-1] {
			t.Fatalf("Get(%d) = %v, %v; want content %s", v, p, err, hashes[v-1])
		}
	}
	if _, err := st.Get(ctx, 0); !errors.Is(err, store.ErrNoVersion) {
		t.Fatalf("Get(0) = %v, want ErrNoVersion", err)
	}
	// A publisher that keeps fewer drops what others kept.
	publish(t, newStore(t, c, store.WithKeep(1)), samplePolicy(t, 999))
	fieldsAre("current", "hash", "v7")
}

func TestPublishRejectsOtherPlane(t *testing.T) {
	srv := redistest.Start(t)
	st, err := store.New(srv.Client(), "other")
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = st.Publish(context.Background(), samplePolicy(t, 10000))
	if err == nil || !strings.Contains(err.Error(), `plane "other": cannot publish the policy of plane "default/main"`) {
		t.Fatalf("Publish of another plane's policy = %v", err)
	}
	if _, _, err := st.Publish(context.Background(), nil); err == nil {
		t.Fatal("Publish(nil) succeeded")
	}
}

// TestConcurrentPublishers: publishers with stale guesses race; every
// content gets its own version, the versions are consecutive, and each
// version holds the content whose publisher got it.
func TestConcurrentPublishers(t *testing.T) {
	const publishers, each = 8, 6
	srv := redistest.Start(t)
	c := srv.Client()
	ctx := context.Background()

	type result struct {
		version int64
		hash    string
		err     error
	}
	results := make(chan result, publishers*each)
	var wg sync.WaitGroup
	for g := range publishers {
		st := newStore(t, c, store.WithKeep(publishers*each)) // one store per publisher: separate guesses
		var mine []*policy.Policy
		for i := range each {
			mine = append(mine, samplePolicy(t, int64(1000+100*g+i)))
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, p := range mine {
				v, changed, err := st.Publish(ctx, p)
				if err == nil && !changed {
					err = fmt.Errorf("content %s reported unchanged at version %d", p.Hash()[:8], v)
				}
				results <- result{v, p.Hash(), err}
			}
		}()
	}
	wg.Wait()
	close(results)

	got := map[int64]string{}
	for r := range results {
		if r.err != nil {
			t.Fatal(r.err)
		}
		if prev, dup := got[r.version]; dup {
			t.Fatalf("version %d returned for contents %s and %s", r.version, prev[:8], r.hash[:8])
		}
		got[r.version] = r.hash
	}
	st := newStore(t, c)
	for v := int64(1); v <= publishers*each; v++ {
		want, ok := got[v]
		if !ok {
			t.Fatalf("no publisher got version %d; got %d versions", v, len(got))
		}
		p, err := st.Get(ctx, v)
		if err != nil || p.Hash() != want {
			t.Fatalf("version %d holds %v (%v), want the content %s its publisher was told", v, p, err, want[:8])
		}
	}
	if cur, err := st.Current(ctx); err != nil || cur.Version() != publishers*each {
		t.Fatalf("Current = %v, %v; want version %d", cur, err, publishers*each)
	}
}

// corruptions are hand-written hashes that must not load; each is written
// over a store whose version 1 is good.
func corruptions(t *testing.T) []struct {
	name   string
	fields []any
	want   string
} {
	good := samplePolicy(t, 10000)
	other := samplePolicy(t, 20000)
	tampered := strings.Replace(string(good.WithVersion(2).Encode()), `"enterprise"`, `"enterprize"`, 1)
	return []struct {
		name   string
		fields []any
		want   string
	}{
		{"not json", []any{"current", 2, "hash", other.Hash(), "v2", "{not json"}, "version 2: corrupt policy: decode policy"},
		{"version mismatch", []any{"current", 2, "hash", good.Hash(), "v2", good.WithVersion(1).Encode()}, "version 2: corrupt policy: the encoding says version 1"},
		{"tampered content", []any{"current", 2, "hash", good.Hash(), "v2", tampered}, "version 2: corrupt policy: decode policy"},
		{"hash field disagrees", []any{"current", 2, "hash", good.Hash(), "v2", other.WithVersion(2).Encode()}, "version 2: corrupt policy: the hash field records content"},
		{"other plane", []any{"current", 2, "hash", good.Hash(), "v2", samplePolicyOf(t, "other", 10000).WithVersion(2).Encode()}, `version 2: corrupt policy: the encoding is of plane "default/other"`},
		{"encoding missing", []any{"current", 2, "hash", other.Hash()}, "version 2: corrupt policy: it is current but its encoding is not stored"},
		{"current not a number", []any{"current", "two"}, `corrupt policy: the current version "two" is not a version number`},
	}
}

func TestCurrentReportsCorruptVersion(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	ctx := context.Background()
	for _, tc := range corruptions(t) {
		t.Run(tc.name, func(t *testing.T) {
			if err := c.Del(ctx, key).Err(); err != nil {
				t.Fatal(err)
			}
			st := newStore(t, c)
			good := samplePolicy(t, 10000)
			publish(t, st, good)
			if err := c.HSet(ctx, key, tc.fields...).Err(); err != nil {
				t.Fatal(err)
			}
			_, err := st.Current(ctx)
			if !errors.Is(err, store.ErrCorrupt) {
				t.Fatalf("Current = %v, want ErrCorrupt", err)
			}
			if msg := err.Error(); !strings.Contains(msg, `store: plane "default/main"`) || !strings.Contains(msg, tc.want) {
				t.Fatalf("Current = %q, want it to name the plane and say %q", msg, tc.want)
			}
			if p, err := st.Get(ctx, 1); err != nil || p.Hash() != good.Hash() {
				t.Fatalf("Get(1) after the corruption = %v, %v", p, err)
			}
		})
	}
}

// TestPublishAfterScriptFlush: the script is loaded again after SCRIPT
// FLUSH (as after a restart or a failover).
func TestPublishAfterScriptFlush(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	ctx := context.Background()
	st := newStore(t, c)
	publish(t, st, samplePolicy(t, 10000))
	if err := c.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if ok, err := c.ScriptExists(ctx, lua.Publish.SHA()).Result(); err != nil || ok[0] {
		t.Fatalf("SCRIPT EXISTS after SCRIPT FLUSH = %v, %v", ok, err)
	}
	if v, changed := publish(t, st, samplePolicy(t, 20000)); v != 2 || !changed {
		t.Fatalf("Publish after SCRIPT FLUSH = (%d, %v), want (2, true)", v, changed)
	}
}

// TestPublishScriptContract calls publish.lua directly: a stale version is
// refused with the current one, and bad arguments are errors.
func TestPublishScriptContract(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	ctx := context.Background()
	a, b := samplePolicy(t, 10000), samplePolicy(t, 20000)
	args := func(p *policy.Policy, version int64, keep int) lua.PublishArgs {
		return lua.PublishArgs{Hash: p.Hash(), Encoding: p.Encode(), Version: version, Keep: keep, Channel: key}
	}
	run := func(a lua.PublishArgs) (lua.PublishReply, error) { return lua.RunPublish(ctx, c, key, a) }

	if r, err := run(args(a.WithVersion(3), 3, 5)); err != nil || r != (lua.PublishReply{Version: 0, Outcome: lua.PublishConflict}) {
		t.Fatalf("version 3 of an empty store = %+v, %v; want a conflict at 0", r, err)
	}
	if r, err := run(args(a.WithVersion(1), 1, 5)); err != nil || r != (lua.PublishReply{Version: 1, Outcome: lua.PublishStored}) {
		t.Fatalf("version 1 of an empty store = %+v, %v; want stored as 1", r, err)
	}
	if r, err := run(args(b.WithVersion(1), 1, 5)); err != nil || r != (lua.PublishReply{Version: 1, Outcome: lua.PublishConflict}) {
		t.Fatalf("new content as version 1 again = %+v, %v; want a conflict at 1", r, err)
	}
	if r, err := run(args(a.WithVersion(9), 9, 5)); err != nil || r != (lua.PublishReply{Version: 1, Outcome: lua.PublishUnchanged}) {
		t.Fatalf("the current content with a stale version = %+v, %v; want unchanged at 1", r, err)
	}
	if n, err := c.HLen(ctx, key).Result(); err != nil || n != 3 {
		t.Fatalf("after refused calls the hash has %d fields (%v), want 3", n, err)
	}
	// A floor above current: the next version is floor + 1, and the reply
	// to a guess of current + 1 names the floor.
	withFloor := func(p *policy.Policy, version, floor int64) lua.PublishArgs {
		a := args(p.WithVersion(version), version, 5)
		a.Floor = floor
		return a
	}
	if r, err := run(withFloor(b, 2, 7)); err != nil || r != (lua.PublishReply{Version: 7, Outcome: lua.PublishConflict}) {
		t.Fatalf("version 2 above floor 7 = %+v, %v; want a conflict at 7", r, err)
	}
	if r, err := run(withFloor(a, 9, 7)); err != nil || r != (lua.PublishReply{Version: 7, Outcome: lua.PublishConflict}) {
		t.Fatalf("the current content (version 1) as 9 above floor 7 = %+v, %v; want a conflict at 7: it is published again above the floor", r, err)
	}
	if r, err := run(withFloor(b, 8, 7)); err != nil || r != (lua.PublishReply{Version: 8, Outcome: lua.PublishStored}) {
		t.Fatalf("version 8 above floor 7 = %+v, %v; want stored as 8", r, err)
	}
	for _, tc := range []struct {
		name string
		args lua.PublishArgs
		want string
	}{
		{"keep 0", args(b.WithVersion(2), 2, 0), "versions to keep must be an integer >= 1"},
		{"version 0", args(b, 0, 5), "version must be an integer >= 1"},
		{"empty hash", lua.PublishArgs{Encoding: []byte("x"), Version: 2, Keep: 5, Channel: key}, "empty content hash"},
		{"floor -1", lua.PublishArgs{Hash: b.Hash(), Encoding: b.Encode(), Version: 2, Keep: 5, Channel: key, Floor: -1}, "floor must be an integer >= 0"},
	} {
		if _, err := run(tc.args); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Fatalf("%s: %v, want an error containing %q", tc.name, err, tc.want)
		}
	}
}

// TestPublishAboveFloor: after Redis lost its data, a publisher that names
// the last version it published (Above) continues above it instead of
// restarting at 1, and content Redis holds at a version not above the
// floor is published again as a new version.
func TestPublishAboveFloor(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	ctx := context.Background()
	a, b := samplePolicy(t, 10000), samplePolicy(t, 20000)
	st := newStore(t, c)
	publish(t, st, a)
	if v, _ := publish(t, st, b); v != 2 {
		t.Fatalf("second version = %d, want 2", v)
	}
	if err := c.FlushAll(ctx).Err(); err != nil { // a restart without persistence
		t.Fatal(err)
	}
	restarted := newStore(t, c) // a new process: no memory of version 2
	if v, changed, err := restarted.Publish(ctx, b, store.Above(2)); err != nil || v != 3 || !changed {
		t.Fatalf("Publish above 2 into an empty Redis = (%d, %t, %v), want (3, true)", v, changed, err)
	}
	if p, err := restarted.Current(ctx); err != nil || p.Version() != 3 || p.Hash() != b.Hash() {
		t.Fatalf("Current = %v, %v; want version 3 of the content published", p, err)
	}
	// The content of version 3, with a floor above 3 (Redis restored from
	// an old backup, say): published again, as version 6.
	if v, changed, err := restarted.Publish(ctx, b, store.Above(5)); err != nil || v != 6 || !changed {
		t.Fatalf("the current content above 5 = (%d, %t, %v), want (6, true)", v, changed, err)
	}
	// A floor at or below the current version changes nothing.
	for _, floor := range []int64{0, 3, 6} {
		if v, changed, err := restarted.Publish(ctx, b, store.Above(floor)); err != nil || v != 6 || changed {
			t.Fatalf("the current content above %d = (%d, %t, %v), want (6, false)", floor, v, changed, err)
		}
	}
	// Without a floor, a store that lost its data starts again at 1 (what
	// enforcers detect as a reset).
	if err := c.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if v, _ := publish(t, newStore(t, c), a); v != 1 {
		t.Fatalf("Publish without a floor into an empty Redis = %d, want 1", v)
	}
	if _, _, err := restarted.Publish(ctx, a, store.Above(-1)); err == nil || !strings.Contains(err.Error(), "at least 0") {
		t.Fatalf("Publish above -1 = %v, want an error", err)
	}
}

// TestPublishSources: sources stored with a version come back with it, are
// replaced when the same content is published with others, and dropped by a
// new version published without them.
func TestPublishSources(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	ctx := context.Background()
	a, b := samplePolicy(t, 10000), samplePolicy(t, 20000)
	st := newStore(t, c)
	if _, _, err := st.Sources(ctx); !errors.Is(err, store.ErrNoPolicy) {
		t.Fatalf("Sources of an empty store = %v, want ErrNoPolicy", err)
	}
	if _, _, err := st.Publish(ctx, a, store.WithSources([]byte("first"))); err != nil {
		t.Fatal(err)
	}
	check := func(wantVersion int64, want string) {
		t.Helper()
		v, got, err := st.Sources(ctx)
		if err != nil || v != wantVersion || string(got) != want || (want == "" && got != nil) {
			t.Fatalf("Sources = (%d, %q, %v), want (%d, %q)", v, got, err, wantVersion, want)
		}
	}
	check(1, "first")
	if v, changed, err := st.Publish(ctx, a, store.WithSources([]byte("second"))); err != nil || v != 1 || changed {
		t.Fatalf("the same content with other sources = (%d, %t, %v), want (1, false)", v, changed, err)
	}
	check(1, "second")
	if _, _, err := st.Publish(ctx, a); err != nil { // unchanged, no sources: kept
		t.Fatal(err)
	}
	check(1, "second")
	publish(t, st, b)
	check(2, "")
}
