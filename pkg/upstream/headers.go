package upstream

import (
	"cmp"
	"fmt"
	"net/http"
	"net/textproto"
	"strings"
)

// The rate-limit headers seed 004's probe reads by default (OpenAI's), and
// the IETF draft's fields (draft-ietf-httpapi-ratelimit-headers).
const (
	DefaultRemainingHeader = "x-ratelimit-remaining-requests"
	DefaultLimitHeader     = "x-ratelimit-limit-requests"

	// RateLimitField and RateLimitPolicyField are the draft's fields since
	// draft 08: RateLimit: "default";r=50;t=30 (remaining r of the policy
	// named "default") and RateLimit-Policy: "default";q=100;w=60 (its
	// quota q per w seconds). Draft 07 has RateLimit as a dictionary,
	// RateLimit: limit=100, remaining=50, reset=5; drafts up to 06 have
	// RateLimit-Limit and RateLimit-Remaining.
	RateLimitField          = "RateLimit"
	RateLimitPolicyField    = "RateLimit-Policy"
	RateLimitLimitField     = "RateLimit-Limit"
	RateLimitRemainingField = "RateLimit-Remaining"
)

// MaxRateLimitValue bounds a rate-limit value: a larger one is taken for
// garbage (no provider grants a trillion requests a window).
const MaxRateLimitValue = 1_000_000_000_000

// RateLimitHeaders say which response headers carry an upstream's quota.
type RateLimitHeaders struct {
	// Remaining and Limit name the pair of headers read first: the
	// requests left in the provider's window and its size.
	// DefaultRemainingHeader and DefaultLimitHeader when empty; plain
	// x-ratelimit-remaining / x-ratelimit-limit, for instance, are
	// configured here.
	Remaining, Limit string
	// IETF also reads the IETF draft's fields (every form of it: see
	// RateLimitField) when the named pair is absent.
	IETF bool
}

// Reading is a quota reading: Remaining requests left of Limit. Both are
// -1 when there is none.
type Reading struct {
	Remaining, Limit int64
}

// NoReading is the reading of an answer without usable rate-limit headers.
var NoReading = Reading{Remaining: -1, Limit: -1}

// Known says the reading holds values.
func (r Reading) Known() bool { return ValidReading(r.Remaining, r.Limit) }

// ParseRateLimit reads the quota reading of a response's header h. Without
// rate-limit headers it returns NoReading and no problem. With headers
// that do not make a reading (not a non-negative integer, larger than
// MaxRateLimitValue, a limit of 0, remaining above the limit, one of a
// pair missing, a malformed structured field) it returns NoReading and the
// problem, for a status: garbage counts as no reading, never as an empty
// quota.
//
// Of several IETF policies (RateLimit items) the reading is the one with
// the smallest remaining share, the policy that binds first.
func ParseRateLimit(h http.Header, names RateLimitHeaders) (Reading, string) {
	remName := cmp.Or(names.Remaining, DefaultRemainingHeader)
	limName := cmp.Or(names.Limit, DefaultLimitHeader)
	remValue, remHas, problem := single(h, remName)
	if problem != "" {
		return NoReading, problem
	}
	limValue, limHas, problem := single(h, limName)
	switch {
	case problem != "":
		return NoReading, problem
	case remHas && limHas:
		return pair(remName, remValue, limName, limValue)
	case remHas:
		return NoReading, fmt.Sprintf("%s without %s", remName, limName)
	case limHas:
		return NoReading, fmt.Sprintf("%s without %s", limName, remName)
	case names.IETF:
		return parseIETF(h)
	}
	return NoReading, ""
}

// single returns the one value of the field name; several lines of one
// value are one value, of different values a problem.
func single(h http.Header, name string) (value string, has bool, problem string) {
	values := h[textproto.CanonicalMIMEHeaderKey(name)]
	if len(values) == 0 {
		values = h[name] // a header map built by hand, not canonical
	}
	if len(values) == 0 {
		return "", false, ""
	}
	for _, v := range values[1:] {
		if strings.TrimSpace(v) != strings.TrimSpace(values[0]) {
			return "", true, fmt.Sprintf("%s has %d different values", name, len(values))
		}
	}
	return values[0], true, ""
}

// pair checks a remaining and a limit header value.
func pair(remName, remValue, limName, limValue string) (Reading, string) {
	rem, problem := count(remName, remValue)
	if problem != "" {
		return NoReading, problem
	}
	lim, problem := count(limName, limValue)
	if problem != "" {
		return NoReading, problem
	}
	return checkReading(rem, lim, remName, limName)
}

func checkReading(rem, lim int64, remName, limName string) (Reading, string) {
	switch {
	case lim == 0:
		return NoReading, fmt.Sprintf("%s is 0", limName)
	case rem > lim:
		return NoReading, fmt.Sprintf("%s %d is above %s %d", remName, rem, limName, lim)
	}
	return Reading{Remaining: rem, Limit: lim}, ""
}

// count parses a header value that must be a non-negative decimal integer
// of at most MaxRateLimitValue, with optional surrounding whitespace.
func count(name, value string) (int64, string) {
	s := strings.Trim(value, " \t")
	if s == "" {
		return 0, fmt.Sprintf("%s is empty", name)
	}
	var n int64
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			if c == '-' && i == 0 && len(s) > 1 {
				return 0, fmt.Sprintf("%s %.32q is negative", name, value)
			}
			return 0, fmt.Sprintf("%s %.32q is not a non-negative integer", name, value)
		}
		n = n*10 + int64(c-'0')
		if n > MaxRateLimitValue {
			return 0, fmt.Sprintf("%s %.32q is larger than %d", name, value, int64(MaxRateLimitValue))
		}
	}
	return n, ""
}

// sfCount checks a structured field's value as a rate-limit value.
func sfCount(name string, b sfBare, has bool) (int64, string) {
	switch {
	case !has:
		return 0, fmt.Sprintf("%s is missing", name)
	case b.kind != sfInteger:
		return 0, fmt.Sprintf("%s is not an integer", name)
	case b.n < 0:
		return 0, fmt.Sprintf("%s %d is negative", name, b.n)
	case b.n > MaxRateLimitValue:
		return 0, fmt.Sprintf("%s %d is larger than %d", name, b.n, int64(MaxRateLimitValue))
	}
	return b.n, ""
}

// parseIETF reads the IETF draft's fields: RateLimit with RateLimit-Policy
// (draft 08 on), RateLimit as a dictionary (draft 07), or RateLimit-Limit
// with RateLimit-Remaining (up to draft 06).
func parseIETF(h http.Header) (Reading, string) {
	if values := h.Values(RateLimitField); len(values) > 0 {
		members, problem := parseSF(strings.Join(values, ","))
		if problem != "" {
			return NoReading, RateLimitField + ": " + problem
		}
		if len(members) > 0 && members[0].key != "" {
			return ietfDictionary(members)
		}
		return ietfPolicies(members, h.Values(RateLimitPolicyField))
	}
	limits, remainings := h.Values(RateLimitLimitField), h.Values(RateLimitRemainingField)
	if len(limits) == 0 && len(remainings) == 0 {
		return NoReading, ""
	}
	if len(limits) == 0 || len(remainings) == 0 {
		return NoReading, fmt.Sprintf("only one of %s and %s", RateLimitLimitField, RateLimitRemainingField)
	}
	// RateLimit-Limit may list its policies after the limit in force:
	// 100, 100;w=60, 1000;w=3600.
	lims, problem := parseSF(strings.Join(limits, ","))
	if problem != "" {
		return NoReading, RateLimitLimitField + ": " + problem
	}
	rems, problem := parseSF(strings.Join(remainings, ","))
	if problem != "" {
		return NoReading, RateLimitRemainingField + ": " + problem
	}
	if lims[0].key != "" || rems[0].key != "" || len(rems) != 1 {
		return NoReading, fmt.Sprintf("%s or %s is not one integer", RateLimitLimitField, RateLimitRemainingField)
	}
	lim, problem := sfCount(RateLimitLimitField, lims[0].item, true)
	if problem != "" {
		return NoReading, problem
	}
	rem, problem := sfCount(RateLimitRemainingField, rems[0].item, true)
	if problem != "" {
		return NoReading, problem
	}
	return checkReading(rem, lim, RateLimitRemainingField, RateLimitLimitField)
}

// ietfDictionary reads draft 07's RateLimit: limit=100, remaining=50, reset=5.
func ietfDictionary(members []sfMember) (Reading, string) {
	var lim, rem sfBare
	var hasLim, hasRem bool
	for _, m := range members {
		switch m.key {
		case "":
			return NoReading, RateLimitField + " mixes a dictionary with list items"
		case "limit":
			lim, hasLim = m.item, true
		case "remaining":
			rem, hasRem = m.item, true
		}
	}
	l, problem := sfCount(RateLimitField+" limit", lim, hasLim)
	if problem != "" {
		return NoReading, problem
	}
	r, problem := sfCount(RateLimitField+" remaining", rem, hasRem)
	if problem != "" {
		return NoReading, problem
	}
	return checkReading(r, l, RateLimitField+" remaining", RateLimitField+" limit")
}

// ietfPolicies reads RateLimit's items ("name";r=…) against the policies of
// RateLimit-Policy ("name";q=…) and keeps the scarcest.
func ietfPolicies(items []sfMember, policyValues []string) (Reading, string) {
	if len(policyValues) == 0 {
		return NoReading, RateLimitField + " without " + RateLimitPolicyField
	}
	policies, problem := parseSF(strings.Join(policyValues, ","))
	if problem != "" {
		return NoReading, RateLimitPolicyField + ": " + problem
	}
	best := NoReading
	for _, it := range items {
		if it.key != "" || (it.item.kind != sfString && it.item.kind != sfToken) {
			return NoReading, RateLimitField + " item is not a policy name"
		}
		name := it.item.text
		r, hasR := it.param("r")
		rem, problem := sfCount(fmt.Sprintf("%s %q r", RateLimitField, name), r, hasR)
		if problem != "" {
			return NoReading, problem
		}
		i := -1
		for j, p := range policies {
			if p.key == "" && (p.item.kind == sfString || p.item.kind == sfToken) && p.item.text == name {
				i = j
				break
			}
		}
		if i < 0 {
			return NoReading, fmt.Sprintf("%s names policy %q that %s lacks", RateLimitField, name, RateLimitPolicyField)
		}
		q, hasQ := policies[i].param("q")
		lim, problem := sfCount(fmt.Sprintf("%s %q q", RateLimitPolicyField, name), q, hasQ)
		if problem != "" {
			return NoReading, problem
		}
		reading, problem := checkReading(rem, lim, fmt.Sprintf("%s %q r", RateLimitField, name), fmt.Sprintf("%s %q q", RateLimitPolicyField, name))
		if problem != "" {
			return NoReading, problem
		}
		// The scarcest share; floats are exact enough to pick it.
		if !best.Known() || float64(rem)/float64(lim) < float64(best.Remaining)/float64(best.Limit) {
			best = reading
		}
	}
	if !best.Known() {
		return NoReading, RateLimitField + " has no items"
	}
	return best, ""
}

// A small parser of RFC 8941 structured fields, enough for the rate-limit
// fields: a list of items with parameters, or a dictionary. Inner lists
// are refused.

type sfKind uint8

const (
	sfInteger sfKind = iota + 1
	sfDecimal
	sfString
	sfToken
	sfBytes
	sfBool
)

type sfBare struct {
	kind sfKind
	text string // a string's or token's text
	n    int64  // an integer's value, a boolean's 0 or 1
}

type sfParam struct {
	key string
	val sfBare
}

// sfMember is a list item (key "") or a dictionary member.
type sfMember struct {
	key    string
	item   sfBare
	params []sfParam
}

func (m *sfMember) param(key string) (sfBare, bool) {
	for _, p := range m.params {
		if p.key == key {
			return p.val, true
		}
	}
	return sfBare{}, false
}

// maxSFMembers bounds the members parsed of one field.
const maxSFMembers = 64

// parseSF parses s as a list or a dictionary (told apart member by member:
// key=value is a dictionary member).
func parseSF(s string) ([]sfMember, string) {
	p := sfParser{s: s}
	p.skip(" ")
	var out []sfMember
	for {
		if len(out) == maxSFMembers {
			return nil, fmt.Sprintf("more than %d members", maxSFMembers)
		}
		m, problem := p.member()
		if problem != "" {
			return nil, problem
		}
		out = append(out, m)
		p.skip(" \t")
		if p.done() {
			return out, ""
		}
		if p.s[p.i] != ',' {
			return nil, fmt.Sprintf("unexpected %q at %d", p.s[p.i], p.i)
		}
		p.i++
		p.skip(" \t")
		if p.done() {
			return nil, "trailing comma"
		}
	}
}

type sfParser struct {
	s string
	i int
}

func (p *sfParser) done() bool { return p.i >= len(p.s) }

func (p *sfParser) skip(set string) {
	for p.i < len(p.s) && strings.IndexByte(set, p.s[p.i]) >= 0 {
		p.i++
	}
}

func (p *sfParser) member() (sfMember, string) {
	var m sfMember
	if !p.done() && (isLCAlpha(p.s[p.i]) || p.s[p.i] == '*') {
		// A key (dictionary) or a token (list): a key is followed by '='.
		start := p.i
		for p.i < len(p.s) && isKeyChar(p.s[p.i]) {
			p.i++
		}
		if p.i < len(p.s) && p.s[p.i] == '=' {
			m.key = p.s[start:p.i]
			p.i++
		} else {
			p.i = start
		}
	}
	if !p.done() && p.s[p.i] == '(' {
		return m, "inner lists are not supported"
	}
	item, problem := p.bare()
	if problem != "" {
		return m, problem
	}
	m.item = item
	m.params, problem = p.parameters()
	return m, problem
}

func (p *sfParser) parameters() ([]sfParam, string) {
	var out []sfParam
	for !p.done() && p.s[p.i] == ';' {
		p.i++
		p.skip(" ")
		start := p.i
		if p.done() || !(isLCAlpha(p.s[p.i]) || p.s[p.i] == '*') {
			return nil, "parameter without a key"
		}
		for p.i < len(p.s) && isKeyChar(p.s[p.i]) {
			p.i++
		}
		param := sfParam{key: p.s[start:p.i], val: sfBare{kind: sfBool, n: 1}}
		if !p.done() && p.s[p.i] == '=' {
			p.i++
			v, problem := p.bare()
			if problem != "" {
				return nil, problem
			}
			param.val = v
		}
		if len(out) == maxSFMembers {
			return nil, "too many parameters"
		}
		out = append(out, param)
	}
	return out, ""
}

func (p *sfParser) bare() (sfBare, string) {
	if p.done() {
		return sfBare{}, "missing value"
	}
	c := p.s[p.i]
	switch {
	case c == '-' || isDigit(c):
		return p.number()
	case c == '"':
		return p.str()
	case c == '*' || isAlpha(c):
		start := p.i
		p.i++
		for p.i < len(p.s) && isTokenChar(p.s[p.i]) {
			p.i++
		}
		return sfBare{kind: sfToken, text: p.s[start:p.i]}, ""
	case c == ':':
		end := strings.IndexByte(p.s[p.i+1:], ':')
		if end < 0 {
			return sfBare{}, "unterminated byte sequence"
		}
		p.i += end + 2
		return sfBare{kind: sfBytes}, ""
	case c == '?':
		if p.i+1 < len(p.s) && (p.s[p.i+1] == '0' || p.s[p.i+1] == '1') {
			p.i += 2
			return sfBare{kind: sfBool, n: int64(p.s[p.i-1] - '0')}, ""
		}
		return sfBare{}, "bad boolean"
	}
	return sfBare{}, fmt.Sprintf("unexpected %q at %d", c, p.i)
}

// number parses an RFC 8941 integer (at most 15 digits) or decimal.
func (p *sfParser) number() (sfBare, string) {
	neg := false
	if p.s[p.i] == '-' {
		neg = true
		p.i++
	}
	start := p.i
	var n int64
	for p.i < len(p.s) && isDigit(p.s[p.i]) {
		n = n*10 + int64(p.s[p.i]-'0')
		p.i++
		if p.i-start > 15 {
			return sfBare{}, "integer of more than 15 digits"
		}
	}
	if p.i == start {
		return sfBare{}, "a sign without digits"
	}
	if p.i < len(p.s) && p.s[p.i] == '.' {
		p.i++
		frac := p.i
		for p.i < len(p.s) && isDigit(p.s[p.i]) {
			p.i++
		}
		if p.i == frac || p.i-frac > 3 || frac-1-start > 12 {
			return sfBare{}, "bad decimal"
		}
		return sfBare{kind: sfDecimal}, ""
	}
	if neg {
		n = -n
	}
	return sfBare{kind: sfInteger, n: n}, ""
}

func (p *sfParser) str() (sfBare, string) {
	p.i++ // the opening quote
	var b strings.Builder
	for p.i < len(p.s) {
		c := p.s[p.i]
		p.i++
		switch {
		case c == '\\':
			if p.i >= len(p.s) || (p.s[p.i] != '"' && p.s[p.i] != '\\') {
				return sfBare{}, "bad escape in a string"
			}
			b.WriteByte(p.s[p.i])
			p.i++
		case c == '"':
			return sfBare{kind: sfString, text: b.String()}, ""
		case c < 0x20 || c > 0x7e:
			return sfBare{}, "a string with a non-printable character"
		default:
			b.WriteByte(c)
		}
	}
	return sfBare{}, "unterminated string"
}

func isDigit(c byte) bool   { return c >= '0' && c <= '9' }
func isLCAlpha(c byte) bool { return c >= 'a' && c <= 'z' }
func isAlpha(c byte) bool   { return isLCAlpha(c) || c >= 'A' && c <= 'Z' }
func isKeyChar(c byte) bool {
	return isLCAlpha(c) || isDigit(c) || c == '_' || c == '-' || c == '.' || c == '*'
}

// isTokenChar: RFC 9110's tchar, plus ':' and '/' (RFC 8941's token).
func isTokenChar(c byte) bool {
	return isAlpha(c) || isDigit(c) || strings.IndexByte("!#$%&'*+-.^_`|~:/", c) >= 0
}
