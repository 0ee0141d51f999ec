package policy

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/url"
	"path"
	"regexp"
	"slices"
	"strings"
)

// What the gateway surfaces need from a plane: which descriptor entries name
// a request's tenant, endpoint and api key (Envoy's rate limit service),
// which endpoint a forwarded request is (forward auth), and which tenant an
// api key belongs to (key binding).

// Key bindings: see v1alpha1.KeyBinding.
const (
	KeyBindingOpen  = "open"
	KeyBindingBound = "bound"
)

// KeyBindings are the values of Spec.KeyBinding; the first is the default.
var KeyBindings = []string{KeyBindingOpen, KeyBindingBound}

// Descriptors says which entry keys of an Envoy rate limit descriptor name
// the tenant, the endpoint and the api key, each list in the order tried.
type Descriptors struct {
	Tenant   []string `json:"tenant"`
	Endpoint []string `json:"endpoint"`
	APIKey   []string `json:"apiKey"`
}

// The default descriptor entry keys.
var (
	DefaultTenantEntries   = []string{"tenant"}
	DefaultEndpointEntries = []string{"endpoint"}
	DefaultAPIKeyEntries   = []string{"api_key"}
)

// Bounds on the gateway fields.
const (
	MaxDescriptorEntries = 8
	MaxMatches           = 16
	MaxKeyHashes         = 1000
	// MaxSecretKeys bounds the keys one tenant takes from its Secret.
	MaxSecretKeys = 10_000
	// MaxPathBytes bounds a match's path and a forwarded path.
	MaxPathBytes = 1024
)

// Path match types: see v1alpha1.PathMatchType.
const (
	PathExact   = "Exact"
	PathPrefix  = "PathPrefix"
	PathPattern = "Pattern"
)

// Match is a compiled EndpointMatch: a path of a type and, optionally, methods.
type Match struct {
	Type    string   `json:"type"`
	Path    string   `json:"path"`
	Methods []string `json:"methods,omitempty"`
}

// KeyHashPrefix starts an api key hash as TenantQuota spec.keyHashes writes it.
const KeyHashPrefix = "sha256:"

// HashKey is the hash of an api key as spec.keyHashes writes it.
func HashKey(key string) string {
	sum := sha256.Sum256([]byte(key))
	return KeyHashPrefix + hex.EncodeToString(sum[:])
}

// ShortKeyHash is what logs, traces and debug output may show of an api
// key: the first 12 hex digits of its SHA-256, never the key.
func ShortKeyHash(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:6])
}

var (
	keyHash      = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)
	entryKey     = regexp.MustCompile(`^[A-Za-z0-9._:-]{1,64}$`)
	matchPath    = regexp.MustCompile(`^/([A-Za-z0-9._~!$&'()*+,;=:@%-]+(/[A-Za-z0-9._~!$&'()*+,;=:@%-]+)*/?)?$`)
	httpMethods  = []string{"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "CONNECT", "TRACE"}
	pathTypeRank = map[string]int{PathExact: 0, PathPattern: 1, PathPrefix: 2}
)

// ValidKeyHash reports whether s is a key hash as spec.keyHashes writes it.
func ValidKeyHash(s string) bool { return keyHash.MatchString(s) }

// KeyBelongs reports whether api key key belongs to the named tenant: the
// tenant is one the plane names and the key's hash is one of its keys.
func (p *Policy) KeyBelongs(tenant, key string) bool {
	if len(key) == 0 || len(key) > MaxNameBytes {
		return false
	}
	var buf [MaxNameBytes]byte // hashing from the stack: no allocation
	n := copy(buf[:], key)
	owner, ok := p.keyOwner[sha256.Sum256(buf[:n])]
	return ok && p.spec.Tenants[owner].Name == tenant
}

// KeyBinding is the plane's key binding, open or bound.
func (p *Policy) KeyBinding() string { return p.spec.KeyBinding }

// Descriptors returns the plane's descriptor entry keys.
func (p *Policy) Descriptors() *Descriptors { return &p.spec.Descriptors }

// ResolveEndpoint finds the endpoint a name from the wire means: the one of
// that name, else the one whose name equals it but for ASCII case (Compile
// refuses two endpoints that differ only in case), so that a spelling
// change never turns a request into an unknown, cheaper one. It does not
// allocate.
func (p *Policy) ResolveEndpoint(name string) (int, bool) {
	if i, ok := p.endpointIndex[name]; ok {
		return i, true
	}
	if len(name) > MaxNameBytes {
		return 0, false
	}
	var buf [MaxNameBytes]byte
	for i := 0; i < len(name); i++ {
		c := name[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		buf[i] = c
	}
	i, ok := p.endpointFold[string(buf[:len(name)])]
	return i, ok
}

// MatchEndpoint classifies a request by method and canonical path (see
// CanonicalPath) into an endpoint: the most specific match of the plane's
// endpoints (see v1alpha1.EndpointQuotaSpec.Match for the order). ok is
// false when no match takes the request.
func (p *Policy) MatchEndpoint(method, canonicalPath string) (endpoint string, ok bool) {
	// A trailing '/' does not take a request out of an Exact or Pattern
	// match: most frameworks route /a/b/ as /a/b.
	trimmed := canonicalPath
	if len(trimmed) > 1 {
		trimmed = strings.TrimSuffix(trimmed, "/")
	}
	for i := range p.matches {
		m := &p.matches[i]
		// HEAD is GET without a body: upstreams serve it with the GET handler.
		if len(m.methods) > 0 && !slices.Contains(m.methods, method) && !(method == "HEAD" && slices.Contains(m.methods, "GET")) {
			continue
		}
		if m.matches(canonicalPath) || m.Type != PathPrefix && trimmed != canonicalPath && !strings.HasSuffix(m.Path, "/") && m.matches(trimmed) {
			return p.spec.Endpoints[m.endpoint].Name, true
		}
	}
	return "", false
}

// compiledMatch is a Match of endpoint index endpoint, its pattern split.
type compiledMatch struct {
	Match
	endpoint int
	methods  []string
	segments []string // Pattern only
}

func (m *compiledMatch) matches(p string) bool {
	switch m.Type {
	case PathExact:
		return p == m.Path
	case PathPrefix:
		if !strings.HasPrefix(p, m.Path) {
			return false
		}
		// Segment by segment: /v1/export takes /v1/export and /v1/export/7,
		// not /v1/exports.
		return len(p) == len(m.Path) || strings.HasSuffix(m.Path, "/") || p[len(m.Path)] == '/'
	default: // Pattern: as many segments, "*" taking any non-empty one
		rest := p[1:]
		for i, seg := range m.segments {
			part, next, more := strings.Cut(rest, "/")
			if more == (i == len(m.segments)-1) { // the path has more or fewer segments
				return false
			}
			if seg == "*" && part == "" || seg != "*" && seg != part {
				return false
			}
			rest = next
		}
		return true
	}
}

// escapeSegment percent-encodes in a decoded path segment what cannot
// stand in it as it is: '%', '?', '#', controls, space and non-ASCII.
// Everything else is written as a segment that needed no decoding is, so
// that /v1/render,pd%66 and /v1/render,pdf are one path.
func escapeSegment(s string) string {
	const hexDigits = "0123456789ABCDEF"
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= 0x20 || c >= 0x7f || c == '%' || c == '?' || c == '#' {
			b.WriteByte('%')
			b.WriteByte(hexDigits[c>>4])
			b.WriteByte(hexDigits[c&15])
			continue
		}
		b.WriteByte(c)
	}
	return b.String()
}

// compare orders matches most specific first.
func (m *compiledMatch) compare(o *compiledMatch) int {
	return cmp.Or(
		cmp.Compare(pathTypeRank[m.Type], pathTypeRank[o.Type]),
		cmp.Compare(len(o.Path), len(m.Path)),
		cmp.Compare(boolRank(len(m.Methods) == 0), boolRank(len(o.Methods) == 0)),
		cmp.Compare(m.endpoint, o.endpoint), // endpoints are sorted by name
		strings.Compare(m.Path, o.Path),
	)
}

func boolRank(b bool) int {
	if b {
		return 1
	}
	return 0
}

// CanonicalPath turns a request URI as a gateway forwards it
// (X-Forwarded-Uri: a path, perhaps with a query, perhaps
// percent-encoded) into the path matches compare: the query and fragment
// cut off, percent-encoding of characters that need none decoded, empty
// and "." segments dropped and ".." resolved, as the upstream will read
// it. What upstreams read differently is refused: a backslash, and an
// encoded '/' or '\' (%2F, %5C), which some split segments at and others
// do not. An error says what is wrong with the URI.
func CanonicalPath(uri string) (string, error) {
	if len(uri) > MaxPathBytes {
		return "", fmt.Errorf("the path is longer than %d bytes", MaxPathBytes)
	}
	p, _, _ := strings.Cut(uri, "?")
	p, _, _ = strings.Cut(p, "#")
	if !strings.HasPrefix(p, "/") {
		return "", fmt.Errorf("the path %q does not start with '/'", p)
	}
	for i := 0; i < len(p); i++ {
		switch {
		case p[i] < 0x21 || p[i] > 0x7e:
			return "", fmt.Errorf("the path has a control, space or non-ASCII byte at %d; percent-encode it", i)
		case p[i] == '\\':
			return "", fmt.Errorf("the path has a backslash at %d, which some upstreams read as '/'", i)
		}
	}
	// Decode segment by segment, and write each as a segment without
	// '%' is written: only what must be encoded stays encoded.
	segments := strings.Split(p[1:], "/")
	for i, s := range segments {
		if !strings.Contains(s, "%") {
			continue
		}
		d, err := url.PathUnescape(s)
		if err != nil {
			return "", fmt.Errorf("the path has a bad percent-encoding in %q", s)
		}
		if strings.ContainsAny(d, "/\\") {
			// Upstreams disagree on whether %2F separates segments (Go's
			// ServeMux: no; WSGI and ASGI frameworks, nginx proxying with
			// a URI: yes), so no reading of it is safe to classify.
			return "", fmt.Errorf("the path encodes a '/' or '\\' (%%2F, %%5C) in %q, which upstreams read differently; send it unencoded", s)
		}
		segments[i] = escapeSegment(d)
	}
	trailing := strings.HasSuffix(p, "/") && len(p) > 1
	clean := path.Clean("/" + strings.Join(segments, "/"))
	if trailing && clean != "/" {
		clean += "/"
	}
	return clean, nil
}

// checkMatchPath reports what is wrong with a match's path, or "".
func checkMatchPath(typ, p string) string {
	switch {
	case len(p) > MaxPathBytes:
		return fmt.Sprintf("the path is longer than %d bytes", MaxPathBytes)
	case !matchPath.MatchString(p):
		return fmt.Sprintf("%q is not an absolute URL path: start with '/', no empty segments, only URL path characters", p)
	}
	for _, s := range strings.Split(p[1:], "/") {
		if s == "." || s == ".." {
			return fmt.Sprintf("%q has a '.' or '..' segment; write the path as the upstream reads it", p)
		}
	}
	if c, err := CanonicalPath(p); err != nil || c != p {
		return fmt.Sprintf("%q is not canonical; write it as %q (percent-encode only what needs it)", p, c)
	}
	if typ == PathPattern && !slices.Contains(strings.Split(p[1:], "/"), "*") {
		return "a Pattern needs at least one segment that is exactly '*'; use Exact or PathPrefix otherwise"
	}
	return ""
}

// checkEntryKeys reports what is wrong with a descriptor entry key list.
func checkEntryKeys(keys []string) string {
	if len(keys) == 0 || len(keys) > MaxDescriptorEntries {
		return fmt.Sprintf("list 1 to %d entry keys", MaxDescriptorEntries)
	}
	for _, k := range keys {
		if !entryKey.MatchString(k) {
			return fmt.Sprintf("%q is not a descriptor entry key; use 1 to 64 letters, digits, '.', '_', ':' or '-'", k)
		}
	}
	if len(slices.Compact(slices.Sorted(slices.Values(keys)))) != len(keys) {
		return "an entry key is listed twice"
	}
	return ""
}
