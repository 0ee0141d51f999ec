package store

import (
	"crypto/ed25519"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"strings"
)

// ErrUnverified: a version's signature is missing, made by a key the reader
// does not trust, or does not match the version's encoding (altered after
// signing). Only a Store with a Verifier reports it; Watch skips such a
// version, the last good policy staying in force.
var ErrUnverified = errors.New("policy signature does not verify")

// signatureContext is signed before a version's encoding, so that a
// signature of a policy can be nothing else's.
const signatureContext = "quotaplane.io/policy/v1\n"

// Signer signs the versions a Store publishes (WithSigner): Ed25519 over
// the version's encoding, stored beside it with the id of the public key
// that verifies it.
type Signer struct {
	key ed25519.PrivateKey
	id  string
}

// NewSigner signs with key.
func NewSigner(key ed25519.PrivateKey) *Signer {
	return &Signer{key: key, id: KeyID(key.Public().(ed25519.PublicKey))}
}

// KeyID is the id of an Ed25519 public key in signatures and logs: the
// first 8 bytes of its SHA-256, in hex.
func KeyID(pub ed25519.PublicKey) string {
	sum := sha256.Sum256(pub)
	return hex.EncodeToString(sum[:8])
}

// ID is the id of the signer's public key (KeyID).
func (s *Signer) ID() string { return s.id }

// sign is the signature field's value of encoding: "<key id>:<base64
// signature>".
func (s *Signer) sign(encoding []byte) string {
	sig := ed25519.Sign(s.key, signed(encoding))
	return s.id + ":" + base64.StdEncoding.EncodeToString(sig)
}

func signed(encoding []byte) []byte {
	return append([]byte(signatureContext), encoding...)
}

// Verifier checks the signatures of the versions a Store reads
// (WithVerifier) against the public keys it trusts: more than one during a
// key rotation.
type Verifier struct {
	keys map[string]ed25519.PublicKey // by KeyID
}

// NewVerifier trusts keys.
func NewVerifier(keys ...ed25519.PublicKey) *Verifier {
	v := &Verifier{keys: map[string]ed25519.PublicKey{}}
	for _, k := range keys {
		v.keys[KeyID(k)] = k
	}
	return v
}

// IDs are the ids of the trusted keys, for logs.
func (v *Verifier) IDs() []string {
	ids := make([]string, 0, len(v.keys))
	for id := range v.keys {
		ids = append(ids, id)
	}
	return ids
}

// verify checks field, the signature field's value, against encoding.
func (v *Verifier) verify(encoding []byte, field string) error {
	if field == "" {
		return errors.New("it is not signed (published by a manager without a signing key, or written by someone else)")
	}
	id, b64, ok := strings.Cut(field, ":")
	sig, err := base64.StdEncoding.DecodeString(b64)
	if !ok || err != nil || len(sig) != ed25519.SignatureSize {
		return errors.New("its signature field is not a signature")
	}
	key, ok := v.keys[id]
	if !ok {
		return fmt.Errorf("it is signed by key %s, which is not trusted here (trusted: %s)", id, strings.Join(v.IDs(), ", "))
	}
	if !ed25519.Verify(key, signed(encoding), sig) {
		return fmt.Errorf("its signature by key %s does not match its content: altered after signing", id)
	}
	return nil
}

// LoadSigner reads an Ed25519 private key from a PEM file (PKCS #8, "PRIVATE
// KEY", as `openssl genpkey -algorithm ed25519` writes it).
func LoadSigner(path string) (*Signer, error) {
	blocks, err := pemBlocks(path)
	if err != nil {
		return nil, err
	}
	if len(blocks) != 1 || blocks[0].Type != "PRIVATE KEY" {
		return nil, fmt.Errorf("policy signing key %s: want one PEM block PRIVATE KEY (openssl genpkey -algorithm ed25519)", path)
	}
	key, err := x509.ParsePKCS8PrivateKey(blocks[0].Bytes)
	if err != nil {
		return nil, fmt.Errorf("policy signing key %s: %w", path, err)
	}
	ed, ok := key.(ed25519.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("policy signing key %s: a %T, want an Ed25519 key (openssl genpkey -algorithm ed25519)", path, key)
	}
	return NewSigner(ed), nil
}

// LoadVerifier reads one or more Ed25519 public keys from a PEM file
// ("PUBLIC KEY" blocks, as `openssl pkey -pubout` writes them). A private
// key is refused: an enforcer needs, and should hold, only the public one.
func LoadVerifier(path string) (*Verifier, error) {
	blocks, err := pemBlocks(path)
	if err != nil {
		return nil, err
	}
	var keys []ed25519.PublicKey
	for _, b := range blocks {
		if b.Type != "PUBLIC KEY" {
			return nil, fmt.Errorf("policy verification key %s: a PEM block %s, want PUBLIC KEY only: give enforcers the public key (openssl pkey -in signing.pem -pubout)", path, b.Type)
		}
		key, err := x509.ParsePKIXPublicKey(b.Bytes)
		if err != nil {
			return nil, fmt.Errorf("policy verification key %s: %w", path, err)
		}
		ed, ok := key.(ed25519.PublicKey)
		if !ok {
			return nil, fmt.Errorf("policy verification key %s: a %T, want an Ed25519 key", path, key)
		}
		keys = append(keys, ed)
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("policy verification key %s: no PEM block PUBLIC KEY", path)
	}
	return NewVerifier(keys...), nil
}

func pemBlocks(path string) ([]*pem.Block, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var blocks []*pem.Block
	for {
		var b *pem.Block
		b, data = pem.Decode(data)
		if b == nil {
			break
		}
		blocks = append(blocks, b)
	}
	return blocks, nil
}

// MarshalSigningKey and MarshalVerificationKey write keys as LoadSigner
// and LoadVerifier read them (tests, tools).
func MarshalSigningKey(key ed25519.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// MarshalVerificationKey: see MarshalSigningKey.
func MarshalVerificationKey(key ed25519.PublicKey) ([]byte, error) {
	der, err := x509.MarshalPKIXPublicKey(key)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), nil
}
