// Package store keeps compiled policies in Redis: the manager publishes each
// plane's policy as numbered versions, enforcers read the current one and
// follow new ones.
//
// # Layout
//
// Everything of plane P sits under the hash tag {P}, so every call touches
// one Redis Cluster slot (PolicyKey names it):
//
//	qp:{P}:policy   hash
//	    current     the current version number N (decimal)
//	    hash        the content hash (hex SHA-256) of version N
//	    v<n>        policy.Encode of version n, for the last K versions
//	    sig<n>      the signature of v<n>, "<key id>:<base64>", when signed
//	    sources     what the publisher compiled version N from, if it said
//	                (WithSources; the manager's objects in force), opaque here
//	qp:{P}:policy   pub/sub channel; the payload is a new N (decimal)
//
// A version's encoding is its policy with that version number inside
// (p.WithVersion(n).Encode()), so it stands alone.
//
// # Guarantees
//
// Publish is one atomic script call (pkg/lua/publish.lua): it stores a new
// version only when the content hash differs from the current one, so
// republishing the same compiled plane changes nothing and wakes nobody.
// Versions grow; concurrent publishers of different content get different
// versions and none is lost (a stale publisher retries). They are
// consecutive unless a publisher names a floor (Above): the last version it
// knows of, which the next one exceeds even when Redis holds less. Old
// versions beyond the last K are dropped in the same call.
//
// Nothing read from Redis is trusted: Current, Get and Watch decode with
// policy.Decode, which revalidates the content and checks its hash, and also
// check that the blob names the plane, the version and (for the current
// version) the content hash the hash fields record. A blob that fails is an
// ErrCorrupt error naming the plane and the version.
//
// Watch subscribes to the channel and also polls the current version, since
// pub/sub notices are fire-and-forget and a subscription drops when Redis
// restarts; every notice, every (re)subscription and every tick runs the same
// read-compare-deliver step. While Redis keeps its data, delivered versions
// strictly increase, each is delivered once, and a corrupt version is
// reported and skipped, the last good policy staying in force. Versions
// published faster than Watch reads may be passed over: it delivers the
// newest it reads.
//
// Redis without persistence loses the hash on a restart; the next publish is
// version 1 again, unless the publisher names a floor (the manager does: the
// version its QuotaPlane's status last recorded), in which case it is the
// floor + 1 and watchers see an ordinary new version. A watcher that reads a version below the one it delivered,
// or the same version with other content, has seen such a reset: it reports
// ErrReset and follows the new history (delivering its current version)
// rather than waiting for its old version number to come back.
//
// # Signatures
//
// Without keys the store trusts Redis: whoever may write the policy hash
// decides what every enforcer enforces. With keys, an enforcer loads only
// what a manager signed. A Store made WithSigner signs each version it
// publishes: Ed25519 over a fixed context string and the version's
// encoding (which names the plane, the version and the content, whose hash
// it carries), stored as sig<n> with the id of the public key (KeyID). A
// Store made WithVerifier checks the signature before it parses anything
// of a version: a version unsigned, signed by a key it does not trust, or
// altered after signing (one byte is enough) is an ErrUnverified error, and
// Watch skips it as it skips a corrupt one, the last good policy staying in
// force. A verifier may trust several keys, for a rotation: enforcers
// trust the old and the new key, then the manager signs with the new one
// (publish.lua stores the same content again as a new version when the
// current one is signed by another key, or unsigned), then enforcers drop
// the old one.
//
// A signature proves that a manager signed a version, not that it is the
// manager's current one: a writer to the hash could put back an older
// signed version whole. The manager only ever publishes above what it
// published (it names a floor, Above, also after Redis lost the hash), so
// a watcher with a verifier refuses a current version older than the one
// it delivered, or was started InForce with, as ErrReplayed, and waits
// for one above it; without a verifier the same is a reset, followed.
//
// Ed25519 rather than HMAC, so that the enforcers hold only the public
// key: with HMAC every enforcer pod would hold a key that can sign, and one
// compromised pod (or anyone who reads its Secret) could forge policies for
// the whole fleet. The private key is the manager's alone (one Secret,
// mounted only there); keys are standard PEM (openssl genpkey -algorithm
// ed25519; openssl pkey -pubout).
//
// What a signature does not stop: a writer to Redis can put back an older
// version that a manager signed, whole (a rollback): enforcers take it for
// a reset and load it, until the manager publishes again (its resync
// publishes above the version its QuotaPlane's status records, within
// --resync-interval). It can delete the policy: enforcers keep the last
// good one; new ones stay unready. The ACL users of pkg/keyspace keep the
// enforcers from writing the policy hash at all; docs/security.md lists
// the rest.
package store
