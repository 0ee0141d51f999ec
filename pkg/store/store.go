package store

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotaplane/quotaplane/pkg/keyspace"
	"github.com/quotaplane/quotaplane/pkg/lua"
	"github.com/quotaplane/quotaplane/pkg/policy"
)

// Defaults of a Store's options.
const (
	DefaultKeep         = 5
	DefaultPollInterval = 2 * time.Second
)

const (
	// maxPublishAttempts bounds Publish's retries after conflicts; each
	// conflict means another publisher stored a version in between.
	maxPublishAttempts = 100
	// maxReadAttempts bounds how often a read follows a current version that
	// moved on between its two round trips.
	maxReadAttempts = 10
)

// Hash fields; see the package doc.
const (
	fieldCurrent = "current"
	fieldHash    = "hash"
	fieldSources = "sources"
)

var (
	// ErrNoPolicy: the plane has no current version.
	ErrNoPolicy = errors.New("no policy published")
	// ErrNoVersion: the version asked for is not kept (never published, or
	// dropped as older than the last K).
	ErrNoVersion = errors.New("version not kept")
	// ErrCorrupt: what Redis holds for a version does not decode to a valid
	// policy of this plane and version.
	ErrCorrupt = errors.New("corrupt policy")
	// ErrReset: the current version went back, or came back with other
	// content: Redis lost the plane's data (a restart without persistence, a
	// flush, a failover to a lagging replica). Watch reports it and follows.
	ErrReset = errors.New("policy store reset")
	// ErrReplayed: with a verifier, the current version is signed but
	// older than the one a watcher delivered (or was started InForce
	// with): a writer to the policy hash put back an older signed version.
	// Watch refuses it as it refuses an unverified one.
	ErrReplayed = errors.New("policy version older than the one in force")
	// ErrInvalidPlane: a plane name that cannot sit in a hash tag.
	ErrInvalidPlane = errors.New("invalid plane name")
)

// PolicyKey names plane's policy hash in Redis, which is also the pub/sub
// channel that hears of new versions: qp:{plane}:policy. The braces make the
// plane the hash tag, so every key of the plane is in one cluster slot.
func PolicyKey(plane string) string { return keyspace.Policy(plane) }

// ValidatePlane checks that plane can name a plane's keys: non-empty and
// free of the braces that delimit a hash tag.
func ValidatePlane(plane string) error {
	if plane == "" {
		return fmt.Errorf("store: %w: the plane name is empty", ErrInvalidPlane)
	}
	if strings.ContainsAny(plane, "{}") {
		return fmt.Errorf("store: %w %q: it must not contain '{' or '}', which delimit the Redis hash tag", ErrInvalidPlane, plane)
	}
	return nil
}

// Option adjusts a Store.
type Option func(*Store)

// WithKeep sets how many versions Publish keeps, the current one included;
// at least 1. Default DefaultKeep.
func WithKeep(versions int) Option { return func(s *Store) { s.keep = versions } }

// WithPollInterval sets how often Watch reads the current version besides
// listening for notices; positive. Default DefaultPollInterval.
func WithPollInterval(d time.Duration) Option { return func(s *Store) { s.pollInterval = d } }

// WithSigner makes Publish sign each version it stores (see the package
// doc, Signatures).
func WithSigner(signer *Signer) Option { return func(s *Store) { s.signer = signer } }

// WithVerifier makes Current, Get and Watch accept only versions signed by
// a key verifier trusts; any other is an ErrUnverified error.
func WithVerifier(verifier *Verifier) Option { return func(s *Store) { s.verifier = verifier } }

// Store is one plane's policies in Redis. It is safe for concurrent use; any
// number of publishers (in any processes) and watchers may share a plane.
type Store struct {
	client       redis.UniversalClient
	plane        string
	key          string // PolicyKey(plane): the hash and the channel
	keep         int
	pollInterval time.Duration
	signer       *Signer   // nil: publish unsigned
	verifier     *Verifier // nil: trust what Redis holds

	// lastVersion is the current version as last seen by this Store: the
	// first guess of the next Publish or Current, checked by Redis, never
	// trusted.
	lastVersion atomic.Int64
}

// New returns the store of plane in c. Reads go where c sends them: give it
// a client that reads from masters, since a lagging replica looks like a
// reset to Watch.
func New(c redis.UniversalClient, plane string, opts ...Option) (*Store, error) {
	if c == nil {
		return nil, errors.New("store: nil Redis client")
	}
	if err := ValidatePlane(plane); err != nil {
		return nil, err
	}
	s := &Store{client: c, plane: plane, key: PolicyKey(plane), keep: DefaultKeep, pollInterval: DefaultPollInterval}
	for _, o := range opts {
		o(s)
	}
	if s.keep < 1 {
		return nil, fmt.Errorf("store: plane %q: keep %d versions: keep at least 1", plane, s.keep)
	}
	if s.pollInterval <= 0 {
		return nil, fmt.Errorf("store: plane %q: poll interval %s: it must be positive", plane, s.pollInterval)
	}
	return s, nil
}

// Plane is the store's plane.
func (s *Store) Plane() string { return s.plane }

// PublishOption adjusts one Publish.
type PublishOption func(*publishOptions)

type publishOptions struct {
	floor   int64
	sources []byte
}

// Above makes the published version exceed version even when Redis holds
// a lower one (or none): the caller's record of the last version it
// published, so that versions keep growing after Redis lost its data
// instead of restarting at 1. Content Redis already holds as its current
// version is published again, as a new version, when that version is not
// above the floor.
func Above(version int64) PublishOption {
	return func(o *publishOptions) { o.floor = version }
}

// WithSources stores sources beside the version Publish leaves current, in
// the same atomic call: what the caller compiled it from (opaque to the
// store, never read by enforcers), for Sources to give back. A new version
// published without sources drops the earlier ones.
func WithSources(sources []byte) PublishOption {
	return func(o *publishOptions) { o.sources = sources }
}

// Publish stores p's content as the plane's next version, unless the current
// version already has that content; either way it returns the version that
// now holds it. p must be a policy of the store's plane; its own version is
// ignored. Only a stored version is announced on the channel.
func (s *Store) Publish(ctx context.Context, p *policy.Policy, opts ...PublishOption) (version int64, changed bool, err error) {
	if p == nil {
		return 0, false, fmt.Errorf("store: plane %q: publish a nil policy", s.plane)
	}
	if p.ID() != s.plane {
		return 0, false, fmt.Errorf("store: plane %q: cannot publish the policy of plane %q", s.plane, p.ID())
	}
	var o publishOptions
	for _, opt := range opts {
		opt(&o)
	}
	if o.floor < 0 {
		return 0, false, fmt.Errorf("store: plane %q: publish above version %d: a version floor is at least 0", s.plane, o.floor)
	}
	next := max(s.lastVersion.Load(), o.floor) + 1
	for range maxPublishAttempts {
		encoding := p.WithVersion(next).Encode()
		var signature string
		if s.signer != nil {
			signature = s.signer.sign(encoding)
		}
		r, err := lua.RunPublish(ctx, s.client, s.key, lua.PublishArgs{
			Hash:      p.Hash(),
			Encoding:  encoding,
			Version:   next,
			Keep:      s.keep,
			Channel:   s.key,
			Floor:     o.floor,
			Sources:   o.sources,
			Signature: signature,
		})
		if err != nil {
			return 0, false, fmt.Errorf("store: plane %q: publish version %d: %w", s.plane, next, err)
		}
		switch r.Outcome {
		case lua.PublishStored:
			s.lastVersion.Store(r.Version)
			return r.Version, true, nil
		case lua.PublishUnchanged:
			s.lastVersion.Store(r.Version)
			return r.Version, false, nil
		}
		next = r.Version + 1 // conflict: encode as the version after max(current, floor)
	}
	return 0, false, fmt.Errorf("store: plane %q: publish: other publishers stored a version in between %d times in a row; giving up at version %d", s.plane, maxPublishAttempts, next)
}

// Sources returns the current version and the sources its publisher stored
// with it (WithSources), read together; sources is nil when it stored none.
// It is ErrNoPolicy when no version is published.
func (s *Store) Sources(ctx context.Context) (version int64, sources []byte, err error) {
	vals, err := s.client.HMGet(ctx, s.key, fieldCurrent, fieldHash, fieldSources).Result()
	if err != nil {
		return 0, nil, fmt.Errorf("store: plane %q: read the current version's sources: %w", s.plane, err)
	}
	h, err := s.parseHead(vals)
	if err != nil {
		return 0, nil, err
	}
	if raw, ok := vals[2].(string); ok {
		sources = []byte(raw)
	}
	return h.version, sources, nil
}

// Current returns the plane's current policy, decoded and checked. It is
// ErrNoPolicy when none is published and ErrCorrupt when what Redis holds
// does not decode.
func (s *Store) Current(ctx context.Context) (*policy.Policy, error) {
	h, blob, sig, err := s.readCurrent(ctx, s.lastVersion.Load())
	if err != nil {
		return nil, err
	}
	return s.decodeCurrent(h, blob, sig)
}

// Get returns a kept version of the plane's policy, decoded and checked. It
// is ErrNoVersion when that version is not kept.
func (s *Store) Get(ctx context.Context, version int64) (*policy.Policy, error) {
	if version < 1 {
		return nil, fmt.Errorf("store: plane %q version %d: %w: versions start at 1", s.plane, version, ErrNoVersion)
	}
	vals, err := s.client.HMGet(ctx, s.key, versionField(version), signatureField(version)).Result()
	if err != nil {
		return nil, fmt.Errorf("store: plane %q version %d: read: %w", s.plane, version, err)
	}
	blob, ok := vals[0].(string)
	if !ok {
		return nil, fmt.Errorf("store: plane %q version %d: %w (the store keeps the last %d)", s.plane, version, ErrNoVersion, s.keep)
	}
	sig, _ := vals[1].(string)
	return s.decodeVersion(version, []byte(blob), sig)
}

// head is what the hash says of the current version.
type head struct {
	version int64  // 0: none
	hash    string // content hash recorded for version
}

func versionField(version int64) string { return "v" + strconv.FormatInt(version, 10) }

func signatureField(version int64) string { return "sig" + strconv.FormatInt(version, 10) }

// readHead reads the current version and its content hash: one small reply,
// what Watch polls.
func (s *Store) readHead(ctx context.Context) (head, error) {
	vals, err := s.client.HMGet(ctx, s.key, fieldCurrent, fieldHash).Result()
	if err != nil {
		return head{}, fmt.Errorf("store: plane %q: read the current version: %w", s.plane, err)
	}
	return s.parseHead(vals)
}

// parseHead reads the replies to HMGET current hash.
func (s *Store) parseHead(vals []any) (head, error) {
	if len(vals) < 2 {
		return head{}, fmt.Errorf("store: plane %q: read the current version: %d replies to HMGET, want 2 or more", s.plane, len(vals))
	}
	raw, ok := vals[0].(string)
	if !ok {
		return head{}, fmt.Errorf("store: plane %q: %w", s.plane, ErrNoPolicy)
	}
	v, err := strconv.ParseInt(raw, 10, 64)
	if err != nil || v < 1 {
		return head{}, fmt.Errorf("store: plane %q: %w: the current version %q is not a version number", s.plane, ErrCorrupt, raw)
	}
	hash, _ := vals[1].(string)
	return head{version: v, hash: hash}, nil
}

// readCurrent reads the current version's head, encoding and signature
// (empty when unsigned) in one HMGET, so they agree: it asks for the
// encoding of guess and, when the current version is another one, asks
// again for that one. The head is returned with ErrCorrupt errors, so that a
// watcher can skip that version.
func (s *Store) readCurrent(ctx context.Context, guess int64) (h head, blob []byte, sig string, err error) {
	for range maxReadAttempts {
		fields := []string{fieldCurrent, fieldHash}
		if guess > 0 {
			fields = append(fields, versionField(guess), signatureField(guess))
		}
		vals, err := s.client.HMGet(ctx, s.key, fields...).Result()
		if err != nil {
			return head{}, nil, "", fmt.Errorf("store: plane %q: read the current version: %w", s.plane, err)
		}
		h, err := s.parseHead(vals)
		if err != nil {
			return head{}, nil, "", err
		}
		s.lastVersion.Store(h.version)
		if h.version != guess {
			guess = h.version
			continue
		}
		blob, ok := vals[2].(string)
		if !ok {
			return h, nil, "", s.corrupt(h.version, errors.New("it is current but its encoding is not stored"))
		}
		sig, _ := vals[3].(string)
		return h, []byte(blob), sig, nil
	}
	return head{}, nil, "", fmt.Errorf("store: plane %q: read the current version: it changed %d times while reading", s.plane, maxReadAttempts)
}

// decodeCurrent decodes the current version's encoding and checks it against
// the recorded content hash.
func (s *Store) decodeCurrent(h head, blob []byte, sig string) (*policy.Policy, error) {
	p, err := s.decodeVersion(h.version, blob, sig)
	if err != nil {
		return nil, err
	}
	if p.Hash() != h.hash {
		return nil, s.corrupt(h.version, fmt.Errorf("the hash field records content %q but the encoding holds %s", h.hash, p.Hash()))
	}
	return p, nil
}

// decodeVersion verifies the signature sig of the encoding stored as
// version (with a verifier, before anything of it is parsed), decodes it and
// checks that it is a valid policy of this plane and of that version.
func (s *Store) decodeVersion(version int64, blob []byte, sig string) (*policy.Policy, error) {
	if s.verifier != nil {
		if err := s.verifier.verify(blob, sig); err != nil {
			return nil, fmt.Errorf("store: plane %q version %d: %w: %w", s.plane, version, ErrUnverified, err)
		}
	}
	p, err := policy.Decode(blob)
	if err != nil {
		return nil, s.corrupt(version, err)
	}
	if p.Version() != version {
		return nil, s.corrupt(version, fmt.Errorf("the encoding says version %d", p.Version()))
	}
	if p.ID() != s.plane {
		return nil, s.corrupt(version, fmt.Errorf("the encoding is of plane %q", p.ID()))
	}
	return p, nil
}

func (s *Store) corrupt(version int64, err error) error {
	return fmt.Errorf("store: plane %q version %d: %w: %w", s.plane, version, ErrCorrupt, err)
}
