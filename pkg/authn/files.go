package authn

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultRecheckInterval is how often, at most, a file is read again to see
// whether it changed.
const DefaultRecheckInterval = time.Second

// maxFileBytes bounds every file this package reads: certificates, keys,
// CA bundles and token files are a few KiB.
const maxFileBytes = 1 << 20

// Option configures how files are watched.
type Option func(*options)

type options struct {
	recheck time.Duration
	now     func() time.Time
	log     *slog.Logger
}

func newOptions(opts []Option) options {
	o := options{recheck: DefaultRecheckInterval, now: time.Now, log: slog.Default()}
	for _, opt := range opts {
		opt(&o)
	}
	return o
}

// WithRecheckInterval sets how often, at most, files are read again; 0
// reads them for every handshake or request.
func WithRecheckInterval(d time.Duration) Option { return func(o *options) { o.recheck = max(d, 0) } }

// WithClock sets the clock that spaces the rechecks.
func WithClock(now func() time.Time) Option { return func(o *options) { o.now = now } }

// WithLogger sets where reload problems are logged.
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.log = l } }

// watched is a value parsed from files, parsed again when their contents
// change. Readers call get, which is lock-free except when a recheck is due,
// and then only one reader rechecks while the others go on with the value
// in force.
type watched[T any] struct {
	files []string
	parse func(contents [][]byte) (T, error)
	opts  options

	current     atomic.Pointer[T]
	nextCheckNs atomic.Int64 // unix ns of the next recheck

	mu  sync.Mutex // guards raw, held by the one reader rechecking
	raw [][]byte   // the contents current was parsed from
}

// newWatched reads and parses the files once: an error here is the
// caller's to report (a process should not start without its credentials).
func newWatched[T any](files []string, parse func([][]byte) (T, error), opts options) (*watched[T], error) {
	w := &watched[T]{files: files, parse: parse, opts: opts}
	raw, err := readFiles(files)
	if err != nil {
		return nil, err
	}
	v, err := parse(raw)
	if err != nil {
		return nil, err
	}
	w.raw = raw
	w.current.Store(&v)
	w.nextCheckNs.Store(opts.now().Add(opts.recheck).UnixNano())
	return w, nil
}

// get returns the value in force, first reading the files again when a
// recheck is due.
func (w *watched[T]) get() *T {
	now := w.opts.now()
	if now.UnixNano() >= w.nextCheckNs.Load() && w.mu.TryLock() {
		w.recheckLocked(now)
		w.mu.Unlock()
	}
	return w.current.Load()
}

func (w *watched[T]) recheckLocked(now time.Time) {
	w.nextCheckNs.Store(now.Add(w.opts.recheck).UnixNano())
	raw, err := readFiles(w.files)
	if err != nil {
		w.opts.log.Warn("keeping the credentials in force", "files", w.files, "err", err)
		return
	}
	if equalContents(raw, w.raw) {
		return
	}
	v, err := w.parse(raw)
	if err != nil {
		w.opts.log.Warn("keeping the credentials in force", "files", w.files, "err", err)
		return
	}
	w.raw = raw
	w.current.Store(&v)
	w.opts.log.Info("credentials reloaded", "files", w.files)
}

func readFiles(files []string) ([][]byte, error) {
	raw := make([][]byte, len(files))
	for i, name := range files {
		b, err := readFile(name)
		if err != nil {
			return nil, err
		}
		raw[i] = b
	}
	return raw, nil
}

func readFile(name string) ([]byte, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", name, err)
	}
	if len(b) > maxFileBytes {
		return nil, fmt.Errorf("%s is larger than %d bytes", name, maxFileBytes)
	}
	return b, nil
}

func equalContents(a, b [][]byte) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !bytes.Equal(a[i], b[i]) {
			return false
		}
	}
	return true
}
