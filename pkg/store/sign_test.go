package store_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/pkg/redistest"
	"github.com/quotaplane/quotaplane/pkg/store"
)

func newKey(t testing.TB) ed25519.PrivateKey {
	t.Helper()
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return key
}

func public(key ed25519.PrivateKey) ed25519.PublicKey { return key.Public().(ed25519.PublicKey) }

// TestSignedPolicies: a signing publisher's versions verify; whatever else
// sits in Redis as the current version does not: one byte altered, a
// version injected without a signature, a self-consistent altered policy
// (hash recomputed) under a copied signature, and a signature by a key the
// reader does not trust. Each is ErrUnverified, for Current and Get.
func TestSignedPolicies(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	ctx := context.Background()
	managerKey := newKey(t)
	publisher := newStore(t, c, store.WithSigner(store.NewSigner(managerKey)))
	reader := newStore(t, c, store.WithVerifier(store.NewVerifier(public(managerKey))))

	p := samplePolicy(t, 10000)
	v, _ := publish(t, publisher, p)
	got, err := reader.Current(ctx)
	if err != nil || got.Version() != v || got.Hash() != p.Hash() {
		t.Fatalf("a signed version: Current = %v, %v", got, err)
	}
	if _, err := reader.Get(ctx, v); err != nil {
		t.Fatalf("a signed version: Get = %v", err)
	}
	sig, err := c.HGet(ctx, key, "sig1").Result()
	if err != nil || !strings.HasPrefix(sig, store.KeyID(public(managerKey))+":") {
		t.Fatalf("sig1 = %q, %v; want the key id and the signature", sig, err)
	}
	// A store without a verifier reads what it always read.
	if _, err := newStore(t, c).Current(ctx); err != nil {
		t.Fatalf("a store without a verifier: %v", err)
	}

	blob, err := c.HGet(ctx, key, "v1").Bytes()
	if err != nil {
		t.Fatal(err)
	}
	unverified := func(what string) {
		t.Helper()
		if _, err := reader.Current(ctx); !errors.Is(err, store.ErrUnverified) {
			t.Fatalf("%s: Current = %v, want ErrUnverified", what, err)
		} else {
			t.Logf("%s: %v", what, err)
		}
	}

	// One byte altered in place (a digit of a limit: still a valid policy
	// but for its embedded hash).
	altered := bytes.Replace(blob, []byte(`"rate":10000`), []byte(`"rate":90000`), 1)
	if bytes.Equal(altered, blob) {
		t.Fatal("the encoding has no global rate 10000 to alter")
	}
	if err := c.HSet(ctx, key, "v1", altered).Err(); err != nil {
		t.Fatal(err)
	}
	unverified("one byte altered")
	if _, err := reader.Get(ctx, 1); !errors.Is(err, store.ErrUnverified) {
		t.Fatalf("one byte altered: Get = %v, want ErrUnverified", err)
	}
	if err := c.HSet(ctx, key, "v1", blob).Err(); err != nil {
		t.Fatal(err)
	}

	// A whole, self-consistent policy injected as version 2, unsigned: the
	// content a writer to Redis wants, with its own hash.
	forged := samplePolicy(t, 99999).WithVersion(2)
	if err := c.HSet(ctx, key, "v2", forged.Encode(), "hash", forged.Hash(), "current", "2").Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := newStore(t, c).Current(ctx); err != nil {
		t.Fatalf("the forgery is a valid policy (a store without a verifier loads it): %v", err)
	}
	unverified("an unsigned version injected")
	// The same under version 1's signature.
	if err := c.HSet(ctx, key, "sig2", sig).Err(); err != nil {
		t.Fatal(err)
	}
	unverified("an injected version under a copied signature")
	// Garbage in the signature field.
	if err := c.HSet(ctx, key, "sig2", "x:notbase64!").Err(); err != nil {
		t.Fatal(err)
	}
	unverified("a garbled signature")

	// Signed by another key: an attacker's own, or a manager the reader does
	// not trust.
	other := newStore(t, c, store.WithSigner(store.NewSigner(newKey(t))))
	publish(t, other, samplePolicy(t, 12345))
	unverified("signed by an untrusted key")

	// The trusted publisher takes over again: verified.
	v, _ = publish(t, publisher, samplePolicy(t, 20000))
	if got, err := reader.Current(ctx); err != nil || got.Version() != v {
		t.Fatalf("after the trusted publisher: %v, %v", got, err)
	}
}

// TestSigningRotation: a reader may trust several keys; a publisher that
// starts signing, or signs with another key, stores the same content again
// as a new version, so that readers that trust only the new key get one;
// signatures go with the versions they sign when old versions are dropped.
func TestSigningRotation(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	ctx := context.Background()
	oldKey, newKeyPair := newKey(t), newKey(t)
	p := samplePolicy(t, 10000)

	if v, changed := publish(t, newStore(t, c, store.WithKeep(2)), p); v != 1 || !changed {
		t.Fatalf("unsigned: %d %v", v, changed)
	}
	oldSigner := newStore(t, c, store.WithKeep(2), store.WithSigner(store.NewSigner(oldKey)))
	if v, changed := publish(t, oldSigner, p); v != 2 || !changed {
		t.Fatalf("the same content, now signed: (%d, %v), want a new version 2", v, changed)
	}
	if v, changed := publish(t, oldSigner, p); v != 2 || changed {
		t.Fatalf("the same content signed by the same key: (%d, %v), want unchanged 2", v, changed)
	}
	both := newStore(t, c, store.WithVerifier(store.NewVerifier(public(oldKey), public(newKeyPair))))
	onlyNew := newStore(t, c, store.WithVerifier(store.NewVerifier(public(newKeyPair))))
	if _, err := both.Current(ctx); err != nil {
		t.Fatalf("a reader trusting both keys: %v", err)
	}
	if _, err := onlyNew.Current(ctx); !errors.Is(err, store.ErrUnverified) {
		t.Fatalf("a reader trusting only the new key: %v, want ErrUnverified", err)
	}
	if v, changed := publish(t, newStore(t, c, store.WithKeep(2), store.WithSigner(store.NewSigner(newKeyPair))), p); v != 3 || !changed {
		t.Fatalf("the same content under the new key: (%d, %v), want a new version 3", v, changed)
	}
	for _, r := range []*store.Store{both, onlyNew} {
		if got, err := r.Current(ctx); err != nil || got.Version() != 3 {
			t.Fatalf("after the rotation: %v, %v", got, err)
		}
	}
	fields, err := c.HKeys(ctx, key).Result()
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(fields)
	if want := []string{"current", "hash", "sig2", "sig3", "v2", "v3"}; !slices.Equal(fields, want) {
		t.Fatalf("fields %v, want %v (signatures dropped with their versions)", fields, want)
	}
}

// TestWatchSkipsUnverified: a watcher with a verifier skips an injected
// version, reports it once as ErrUnverified, and delivers the next signed
// one.
func TestWatchSkipsUnverified(t *testing.T) {
	checkNoLeak(t)
	srv := redistest.Start(t)
	c := srv.Client()
	managerKey := newKey(t)
	publisher := newStore(t, c, store.WithSigner(store.NewSigner(managerKey)))
	p1 := samplePolicy(t, 10000)
	publish(t, publisher, p1)
	w := startWatch(t, newStore(t, c, store.WithPollInterval(10*time.Millisecond), store.WithVerifier(store.NewVerifier(public(managerKey)))))
	w.expect(t, 1, p1.Hash())

	forged := samplePolicy(t, 99999).WithVersion(2)
	if err := c.HSet(context.Background(), key, "v2", forged.Encode(), "hash", forged.Hash(), "current", "2").Err(); err != nil {
		t.Fatal(err)
	}
	w.nextError(t, func(err error) bool { return errors.Is(err, store.ErrUnverified) })
	w.nothingDelivered(t)

	p3 := samplePolicy(t, 30000)
	if v, _ := publish(t, publisher, p3); v != 3 {
		t.Fatalf("published version %d, want 3", v)
	}
	w.expect(t, 3, p3.Hash())
}

// TestKeyFiles: keys load from PEM files as openssl writes them; an
// enforcer given the private key, a key of another kind or no key is told
// what to give instead.
func TestKeyFiles(t *testing.T) {
	dir := t.TempDir()
	key := newKey(t)
	write := func(name string, data []byte) string {
		t.Helper()
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	private, err := store.MarshalSigningKey(key)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := store.MarshalVerificationKey(public(key))
	if err != nil {
		t.Fatal(err)
	}
	otherPub, _ := store.MarshalVerificationKey(public(newKey(t)))
	signer, err := store.LoadSigner(write("signing.pem", private))
	if err != nil || signer.ID() != store.KeyID(public(key)) {
		t.Fatalf("LoadSigner: %v, %v", signer, err)
	}
	verifier, err := store.LoadVerifier(write("public.pem", append(pub, otherPub...)))
	if err != nil || len(verifier.IDs()) != 2 {
		t.Fatalf("LoadVerifier of two keys: %v, %v", verifier, err)
	}
	for _, c := range []struct {
		load func(string) error
		data []byte
		want string
	}{
		{func(p string) error { _, err := store.LoadVerifier(p); return err }, private, "want PUBLIC KEY only"},
		{func(p string) error { _, err := store.LoadVerifier(p); return err }, []byte("nothing"), "no PEM block PUBLIC KEY"},
		{func(p string) error { _, err := store.LoadSigner(p); return err }, pub, "want one PEM block PRIVATE KEY"},
	} {
		if err := c.load(write("bad.pem", c.data)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("got %v, want an error with %q", err, c.want)
		}
	}
}

// TestWatchRefusesReplayedVersion: a writer to the policy hash puts back an
// older version the manager signed (its encoding and signature still in the
// hash, or copied from a backup). A watcher with a verifier refuses it
// (ErrReplayed), delivers nothing, and delivers the manager's next version;
// a watcher started InForce with the version its caller loaded refuses it
// from its first read. Without a verifier the same is a store reset, and
// followed. Before, signed watchers followed it as a reset too.
func TestWatchRefusesReplayedVersion(t *testing.T) {
	checkNoLeak(t)
	srv := redistest.Start(t)
	c := srv.Client()
	ctx := context.Background()
	managerKey := newKey(t)
	publisher := newStore(t, c, store.WithSigner(store.NewSigner(managerKey)))
	verifying := func() *store.Store {
		return newStore(t, c, store.WithPollInterval(10*time.Millisecond), store.WithVerifier(store.NewVerifier(public(managerKey))))
	}
	p1, p2 := samplePolicy(t, 10000), samplePolicy(t, 20000)
	publish(t, publisher, p1)
	publish(t, publisher, p2)
	w := startWatch(t, verifying())
	w.expect(t, 2, p2.Hash())
	plain := startWatch(t, newStore(t, c, store.WithPollInterval(10*time.Millisecond)))
	plain.expect(t, 2, p2.Hash())
	loaded, err := verifying().Current(ctx)
	if err != nil {
		t.Fatal(err)
	}

	// Version 1, whole and signed, put back as the current one.
	if err := c.HSet(ctx, key, "current", "1", "hash", p1.Hash()).Err(); err != nil {
		t.Fatal(err)
	}
	err = w.nextError(t, func(err error) bool { return errors.Is(err, store.ErrReplayed) })
	if !strings.Contains(err.Error(), "version 1 is signed but older than version 2 in force") {
		t.Errorf("the refusal says %q; want the versions named", err)
	}
	started := startWatch(t, verifying(), store.InForce(loaded.Version(), loaded.Hash()))
	started.nextError(t, func(err error) bool { return errors.Is(err, store.ErrReplayed) })
	plain.nextError(t, func(err error) bool { return errors.Is(err, store.ErrReset) })
	plain.expect(t, 1, p1.Hash())
	w.nothingDelivered(t)
	started.nothingDelivered(t)

	// The manager publishes above what it published (its floor, as
	// controllers do): loaded by both.
	p3 := samplePolicy(t, 30000)
	if v, _, err := publisher.Publish(ctx, p3, store.Above(2)); err != nil || v != 3 {
		t.Fatalf("published version %d (%v), want 3", v, err)
	}
	w.expect(t, 3, p3.Hash())
	started.expect(t, 3, p3.Hash())
}
