package enforcer

import (
	"fmt"

	"github.com/quotaplane/quotaplane/pkg/policy"
)

// ValidateRequest checks a request as it comes from the wire, before the
// engine looks anything up: the tenant is a name (policy.ValidName); the
// api key is empty or a name; the endpoint is empty (no named endpoint: the
// plane's unknownEndpoints policy applies, cost 1, no endpoint limit) or an
// endpoint name (policy.ValidEndpointName: 1 to 128 of [A-Za-z0-9._~-]);
// the tier is empty or a tier name (policy.ValidTierName); units are in
// [0, MaxUnits]. Its errors wrap ErrInvalidRequest and name the field and
// the rule; they never quote the api key, nor a value that breaks the rule.
//
// Decide, DecideAt and DecideAll call it first, in every mode; gateways
// call it to answer 400 before they ask. It allocates nothing for a valid
// request.
func ValidateRequest(r *Request) error {
	if !policy.ValidName(r.Tenant) {
		return fmt.Errorf("%w: tenant %s; use 1 to %d printable ASCII characters without spaces", ErrInvalidRequest,
			nameProblem(r.Tenant, policy.MaxNameBytes, isNameByte), policy.MaxNameBytes)
	}
	if r.Endpoint != "" && !validEndpointName(r.Endpoint) {
		return fmt.Errorf("%w: endpoint %s; use none, or 1 to %d of A-Z, a-z, 0-9, '.', '_', '~' and '-'", ErrInvalidRequest,
			nameProblem(r.Endpoint, maxEndpointBytes, isEndpointByte), maxEndpointBytes)
	}
	return validateRest(r)
}

// validateRest is ValidateRequest past the tenant and the endpoint: for a
// request whose tenant and endpoint the policy names, which are names.
func validateRest(r *Request) error {
	if r.APIKey != "" && !policy.ValidName(r.APIKey) {
		return fmt.Errorf("%w: api key %s; use none, or 1 to %d printable ASCII characters without spaces", ErrInvalidRequest,
			nameProblem(r.APIKey, policy.MaxNameBytes, isNameByte), policy.MaxNameBytes)
	}
	if r.Tier != "" && !validTierName(r.Tier) {
		return fmt.Errorf("%w: tier is not a tier name; use none, or a DNS label (1 to %d of a-z, 0-9 and '-', starting and ending with a letter or digit)",
			ErrInvalidRequest, maxTierBytes)
	}
	if r.Units < 0 || r.Units > MaxUnits {
		return fmt.Errorf("%w: units %d out of range [0, %d]", ErrInvalidRequest, r.Units, MaxUnits)
	}
	return nil
}

// The rules of policy.ValidEndpointName and policy.ValidTierName, by byte:
// their regular expressions cost some 300 ns a match, more than a whole
// decision. TestValidatorsMatchPolicy checks that both agree with pkg/policy.
const (
	maxEndpointBytes = 128
	maxTierBytes     = 63
)

// endpointBytes marks the bytes of an endpoint name: [A-Za-z0-9._~-].
var endpointBytes = func() (t [256]bool) {
	for c := 0; c < 256; c++ {
		t[c] = 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '~' || c == '-'
	}
	return t
}()

func isNameByte(c byte) bool     { return c >= 0x21 && c <= 0x7e }
func isEndpointByte(c byte) bool { return endpointBytes[c] }

// validEndpointName is policy.ValidEndpointName.
func validEndpointName(s string) bool {
	if len(s) == 0 || len(s) > maxEndpointBytes {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !endpointBytes[s[i]] {
			return false
		}
	}
	return true
}

// nameProblem says what breaks a name's rule (1 to maxBytes bytes, each
// one ok) for the error of a name that breaks it; it never quotes s.
func nameProblem(s string, maxBytes int, ok func(byte) bool) string {
	switch {
	case len(s) == 0:
		return "is empty"
	case len(s) > maxBytes:
		return fmt.Sprintf("is %d bytes long, more than %d", len(s), maxBytes)
	}
	for i := 0; i < len(s); i++ {
		if !ok(s[i]) {
			return fmt.Sprintf("has byte 0x%02x at offset %d, which is not allowed", s[i], i)
		}
	}
	return "breaks the rule"
}

// validTierName is policy.ValidTierName: a DNS label.
func validTierName(s string) bool {
	if len(s) == 0 || len(s) > maxTierBytes || s[0] == '-' || s[len(s)-1] == '-' {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

// resolve checks r against the snapshot's policy, as every backend does
// first: the request is valid (ValidateRequest); its api key belongs to its
// tenant when the plane binds keys; its endpoint is one the plane names
// (resolved canonically: see snapshot.endpoint) or the plane lets unknown
// endpoints through; its tenant is one the plane names or the plane lets
// unknown tenants through. known says the caller found r's tenant among
// the policy's (snapshot.known); false when it did not look. It returns
// the endpoint's index (-1: no named endpoint) and the request's cost. It
// creates no state and moves no bucket.
//
// A name the policy holds is a valid name: a request whose tenant and
// endpoint it names has only the rest checked (validateRest), which is a
// tenth of the uncontended decision less.
func (s *snapshot) resolve(r *Request, known bool) (ep int, cost int64, err error) {
	ep, cost, ok := s.endpoint(r.Endpoint)
	if known && (ep >= 0 || r.Endpoint == "") {
		err = validateRest(r)
	} else {
		err = ValidateRequest(r)
	}
	if err != nil {
		return -1, 0, err
	}
	if s.bound && !s.policy.KeyBelongs(r.Tenant, r.APIKey) {
		return -1, 0, keyNotBound(r, s.policy.Plane())
	}
	if !ok {
		return -1, 0, fmt.Errorf("%w: %q is not an endpoint of plane %s", ErrUnknownEndpoint, r.Endpoint, s.policy.Plane())
	}
	if s.denyUnknown && !known && s.known[r.Tenant] == nil {
		if _, known := s.policy.Tenant(r.Tenant); !known { // central's snapshot has no tenant states
			return -1, 0, fmt.Errorf("%w: %q is not a tenant of plane %s, which denies unknown tenants", ErrUnknownTenant, r.Tenant, s.policy.Plane())
		}
	}
	return ep, cost * max(r.Units, 1), nil
}

// keyNotBound is ErrKeyNotBound for r: the tenant and the key's short hash,
// never the key.
func keyNotBound(r *Request, plane string) error {
	if r.APIKey == "" {
		return fmt.Errorf("%w: the request names tenant %q without an api key, and plane %s binds keys to tenants", ErrKeyNotBound, r.Tenant, plane)
	}
	return fmt.Errorf("%w: api key %s is not a key of tenant %q (plane %s binds keys to tenants)", ErrKeyNotBound,
		policy.ShortKeyHash(r.APIKey), r.Tenant, plane)
}
