package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/quotaplane/quotaplane/pkg/policy"
)

// Watch delivers the plane's current policy to onPolicy, then every newer
// version, until ctx ends; it returns ctx's error.
//
// It subscribes to the plane's channel and also reads the current version
// every poll interval, so a lost notice delays a version by one interval at
// most, and a dropped subscription (Redis restarted) is followed by a read
// as soon as it is back. A notice, a (re)subscription and a tick all run the
// same step: read the current version's head; if it is neither the
// delivered one nor a skipped corrupt one, read, decode and deliver it. See
// the package doc for the guarantees.
//
// onError, when not nil, hears what Watch could not deliver: Redis errors,
// ErrNoPolicy, ErrCorrupt, ErrUnverified and ErrReplayed versions
// (skipped; the last good policy stays in force) and ErrReset (followed). An error equal to the one reported just
// before is not reported again, so an outage or an empty store is reported
// once, not once per poll.
//
// onPolicy and onError run on Watch's goroutine, one at a time, and Watch
// reads nothing while they run: keep them short. Each Watch call holds one
// subscription connection, closed (and its goroutines ended) before it
// returns.
func (s *Store) Watch(ctx context.Context, onPolicy func(*policy.Policy), onError func(error), opts ...WatchOption) error {
	if onPolicy == nil {
		return fmt.Errorf("store: plane %q: watch without a policy handler", s.plane)
	}
	// Notices and subscription confirmations are both reasons to read. The
	// confirmation's read sees every version published before Redis
	// registered the subscription, and after a resubscription (the PubSub
	// reconnects by itself) what was published while it was down is read at
	// once. A subscription Redis refuses is not reported: the poll alone
	// then delivers.
	sub := s.client.Subscribe(ctx, s.key)
	wake := sub.ChannelWithSubscriptions()
	defer func() {
		_ = sub.Close()
		for range wake { // the PubSub's receiver closes wake once it sees the close
		}
	}()
	ticker := time.NewTicker(s.pollInterval)
	defer ticker.Stop()

	w := watcher{store: s, onPolicy: onPolicy, onError: onError}
	for _, o := range opts {
		o(&w)
	}
	w.sync(ctx)
	for ctx.Err() == nil { // a handler may have run past ctx's end: read no more
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-wake:
			drain(wake) // a burst of notices is one read
		case <-ticker.C:
		}
		w.sync(ctx)
	}
	return ctx.Err()
}

// WatchOption tunes a Watch.
type WatchOption func(*watcher)

// InForce starts a Watch as if it had delivered version with content
// hash (policy.Hash), the policy its caller read (Current) and put in force
// before watching: it is not delivered again, and with a verifier a
// version older than it is refused from the first read (ErrReplayed), not
// only after a delivery. Version 0 is none.
func InForce(version int64, hash string) WatchOption {
	return func(w *watcher) { w.delivered = head{version: version, hash: hash} }
}

// drain empties the queued values of ch without blocking.
func drain(ch <-chan any) {
	for {
		select {
		case _, ok := <-ch:
			if !ok {
				return
			}
		default:
			return
		}
	}
}

// watcher is the state of one Watch call, owned by its goroutine.
type watcher struct {
	store    *Store
	onPolicy func(*policy.Policy)
	onError  func(error)

	delivered head   // the last version handed to onPolicy
	skipped   head   // the last version found corrupt or unverified
	lastError string // the last error reported, "" after a clean step
}

// sync reads the current version and delivers it when it is new.
func (w *watcher) sync(ctx context.Context) {
	h, err := w.store.readHead(ctx)
	if err != nil {
		w.report(ctx, err)
		return
	}
	if !wants(w.delivered, w.skipped, h) {
		w.lastError = ""
		return
	}
	got, blob, sig, err := w.store.readCurrent(ctx, h.version)
	if err == nil && !wants(w.delivered, w.skipped, got) {
		w.lastError = "" // it moved back to what we hold
		return
	}
	var p *policy.Policy
	if err == nil {
		p, err = w.store.decodeCurrent(got, blob, sig)
	}
	if err == nil && w.store.verifier != nil && got.version < w.delivered.version {
		// Signed, but the manager only ever publishes above what it
		// published (Above: also after Redis lost the hash), so an older
		// version is one put back by another writer to the hash: a replay
		// of what the manager once signed, refused like a forgery.
		err = fmt.Errorf("store: plane %q: %w: version %d is signed but older than version %d in force (put back by a writer to the policy hash?): refused until a version above %d",
			w.store.plane, ErrReplayed, got.version, w.delivered.version, w.delivered.version)
	}
	if (errors.Is(err, ErrCorrupt) || errors.Is(err, ErrUnverified) || errors.Is(err, ErrReplayed)) && got.version > 0 {
		w.skipped = got
	}
	if err != nil {
		w.report(ctx, err)
		return
	}
	if isReset(w.delivered, got) {
		w.report(ctx, fmt.Errorf("store: plane %q: %w: delivered version %d, now the current version is %d with content %s: following it",
			w.store.plane, ErrReset, w.delivered.version, got.version, got.hash))
	}
	w.delivered = got
	w.lastError = ""
	w.onPolicy(p)
}

// report hands err to onError unless it repeats the previous report or ctx
// has ended (Watch is returning).
func (w *watcher) report(ctx context.Context, err error) {
	if ctx.Err() != nil || w.onError == nil {
		return
	}
	if msg := err.Error(); msg != w.lastError {
		w.lastError = msg
		w.onError(err)
	}
}

// wants says whether a watcher that delivered one version and skipped
// another should read current: anything else is either newer or a reset.
func wants(delivered, skipped, current head) bool {
	return current != delivered && current != skipped
}

// isReset says whether reading current after delivering delivered means
// the store lost its data: version numbers never go back, and a version
// never changes content, while Redis keeps the plane's hash.
func isReset(delivered, current head) bool {
	if delivered.version == 0 {
		return false
	}
	return current.version < delivered.version ||
		current.version == delivered.version && current.hash != delivered.hash
}
