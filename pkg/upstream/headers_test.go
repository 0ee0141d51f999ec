package upstream_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/quotaplane/quotaplane/pkg/upstream"
)

// header builds a header from name, value pairs, as a client would get it
// (canonical keys; a name given twice is two field lines).
func header(kv ...string) http.Header {
	h := http.Header{}
	for i := 0; i+1 < len(kv); i += 2 {
		h.Add(kv[i], kv[i+1])
	}
	return h
}

var (
	openAI = upstream.RateLimitHeaders{}
	plain  = upstream.RateLimitHeaders{Remaining: "x-ratelimit-remaining", Limit: "x-ratelimit-limit"}
	ietf   = upstream.RateLimitHeaders{IETF: true}
)

func TestParseRateLimit(t *testing.T) {
	for _, tc := range []struct {
		name  string
		h     http.Header
		names upstream.RateLimitHeaders
		want  upstream.Reading
	}{
		{"OpenAI's", header("x-ratelimit-remaining-requests", "59", "x-ratelimit-limit-requests", "60"), openAI, upstream.Reading{Remaining: 59, Limit: 60}},
		{"OpenAI's, with whitespace", header("X-Ratelimit-Remaining-Requests", " 0\t", "X-Ratelimit-Limit-Requests", "60 "), openAI, upstream.Reading{Remaining: 0, Limit: 60}},
		{"OpenAI's, a repeated line", header("x-ratelimit-remaining-requests", "5", "x-ratelimit-remaining-requests", "5", "x-ratelimit-limit-requests", "6"), openAI, upstream.Reading{Remaining: 5, Limit: 6}},
		{"plain, configured", header("X-RateLimit-Remaining", "4999", "X-RateLimit-Limit", "5000", "X-RateLimit-Reset", "1372700873"), plain, upstream.Reading{Remaining: 4999, Limit: 5000}},
		{"the largest values", header("x-ratelimit-remaining-requests", "1000000000000", "x-ratelimit-limit-requests", "1000000000000"), openAI, upstream.Reading{Remaining: 1e12, Limit: 1e12}},
		{"IETF, draft 08 on", header("RateLimit", `"default";r=50;t=30`, "RateLimit-Policy", `"default";q=100;w=60`), ietf, upstream.Reading{Remaining: 50, Limit: 100}},
		{"IETF, token names and a partition key", header("RateLimit", `default;r=0;t=1;pk=:cHsdsRa894==:`, "RateLimit-Policy", `default;q=10;w=1;qu="requests";pk=:cHsdsRa894==:`), ietf, upstream.Reading{Remaining: 0, Limit: 10}},
		{"IETF, quotaplane's own headers", header("RateLimit", `"tenant";r=40;t=2`, "RateLimit-Policy", `"global";q=10000;w=1, "tenant";q=50;w=1, "endpoint";q=100;w=300`), ietf, upstream.Reading{Remaining: 40, Limit: 50}},
		{"IETF, the scarcest of two", header("RateLimit", `"day";r=90, "second";r=5`, "RateLimit-Policy", `"day";q=100;w=86400`, "RateLimit-Policy", `"second";q=10;w=1`), ietf, upstream.Reading{Remaining: 5, Limit: 10}},
		{"IETF, draft 07's dictionary", header("RateLimit", "limit=100, remaining=50, reset=5"), ietf, upstream.Reading{Remaining: 50, Limit: 100}},
		{"IETF, drafts up to 06", header("RateLimit-Limit", "100, 100;w=60, 1000;w=3600", "RateLimit-Remaining", "50", "RateLimit-Reset", "5"), ietf, upstream.Reading{Remaining: 50, Limit: 100}},
		{"the named pair before IETF", header("x-ratelimit-remaining-requests", "1", "x-ratelimit-limit-requests", "2", "RateLimit", "limit=100, remaining=50"), ietf, upstream.Reading{Remaining: 1, Limit: 2}},
		{"IETF fields without IETF", header("RateLimit", `"default";r=50`, "RateLimit-Policy", `"default";q=100`), openAI, upstream.NoReading},
		{"no headers", header("Content-Type", "application/json"), ietf, upstream.NoReading},
		{"plain headers when OpenAI's are configured", header("X-RateLimit-Remaining", "1", "X-RateLimit-Limit", "2"), openAI, upstream.NoReading},
	} {
		got, problem := upstream.ParseRateLimit(tc.h, tc.names)
		if got != tc.want || problem != "" {
			t.Errorf("%s: %+v %q, want %+v and no problem", tc.name, got, problem, tc.want)
		}
	}
}

// TestParseRateLimitGarbage: every form of garbage is no reading, with a
// problem naming it; none is an empty quota.
func TestParseRateLimitGarbage(t *testing.T) {
	pair := func(rem, lim string) http.Header {
		return header("x-ratelimit-remaining-requests", rem, "x-ratelimit-limit-requests", lim)
	}
	policy := func(rl, rlp string) http.Header { return header("RateLimit", rl, "RateLimit-Policy", rlp) }
	for _, tc := range []struct {
		name    string
		h       http.Header
		names   upstream.RateLimitHeaders
		problem string // a part of the problem
	}{
		{"non-numeric", pair("lots", "60"), openAI, "not a non-negative integer"},
		{"a number and a word", pair("59", "60 requests"), openAI, "not a non-negative integer"},
		{"a decimal", pair("59.0", "60"), openAI, "not a non-negative integer"},
		{"a plus sign", pair("+59", "60"), openAI, "not a non-negative integer"},
		{"a list", pair("59, 58", "60"), openAI, "not a non-negative integer"},
		{"negative", pair("-1", "60"), openAI, "negative"},
		{"empty", pair("", "60"), openAI, "empty"},
		{"remaining above limit", pair("61", "60"), openAI, "above"},
		{"limit 0", pair("0", "0"), openAI, "is 0"},
		{"huge", pair("5", "1000000000001"), openAI, "larger than"},
		{"past int64", pair("5", "99999999999999999999999999"), openAI, "larger than"},
		{"remaining alone", header("x-ratelimit-remaining-requests", "5"), openAI, "without x-ratelimit-limit-requests"},
		{"limit alone", header("x-ratelimit-limit-requests", "5"), openAI, "without x-ratelimit-remaining-requests"},
		{"two different values", header("x-ratelimit-remaining-requests", "5", "x-ratelimit-remaining-requests", "6", "x-ratelimit-limit-requests", "60"), openAI, "2 different values"},
		{"plain, garbage", header("X-RateLimit-Remaining", "NaN", "X-RateLimit-Limit", "5000"), plain, "x-ratelimit-remaining"},

		{"IETF: no policy field", header("RateLimit", `"default";r=50`), ietf, "without RateLimit-Policy"},
		{"IETF: a policy not listed", policy(`"burst";r=5`, `"default";q=100`), ietf, `policy "burst"`},
		{"IETF: r missing", policy(`"default";t=5`, `"default";q=100`), ietf, "r is missing"},
		{"IETF: q missing", policy(`"default";r=5`, `"default";w=60`), ietf, "q is missing"},
		{"IETF: r negative", policy(`"default";r=-1`, `"default";q=100`), ietf, "negative"},
		{"IETF: r a decimal", policy(`"default";r=5.5`, `"default";q=100`), ietf, "not an integer"},
		{"IETF: r a string", policy(`"default";r="5"`, `"default";q=100`), ietf, "not an integer"},
		{"IETF: q 0", policy(`"default";r=0`, `"default";q=0`), ietf, "is 0"},
		{"IETF: r above q", policy(`"default";r=500`, `"default";q=100`), ietf, "above"},
		{"IETF: q huge", policy(`"default";r=5`, `"default";q=2000000000000`), ietf, "larger than"},
		{"IETF: 16 digits", policy(`"default";r=1234567890123456`, `"default";q=100`), ietf, "more than 15 digits"},
		{"IETF: an unterminated string", policy(`"default;r=5`, `"default";q=100`), ietf, "unterminated string"},
		{"IETF: an inner list", policy(`(1 2);r=5`, `"default";q=100`), ietf, "inner lists"},
		{"IETF: an item not a name", policy(`5;r=5`, `"default";q=100`), ietf, "not a policy name"},
		{"IETF: a trailing comma", policy(`"default";r=5,`, `"default";q=100`), ietf, "trailing comma"},
		{"IETF: junk after an item", policy(`"default";r=5 x`, `"default";q=100`), ietf, "unexpected"},
		{"IETF: a malformed policy field", policy(`"default";r=5`, `"default";q=`), ietf, "RateLimit-Policy: missing value"},
		{"IETF 07: limit missing", header("RateLimit", "remaining=50, reset=5"), ietf, "limit is missing"},
		{"IETF 07: remaining above limit", header("RateLimit", "limit=10, remaining=50"), ietf, "above"},
		{"IETF 07: a dictionary mixed with items", header("RateLimit", `limit=10, remaining=5, "default";r=5`), ietf, "mixes"},
		{"IETF 06: the limit alone", header("RateLimit-Limit", "100"), ietf, "only one of"},
		{"IETF 06: garbage", header("RateLimit-Limit", "100", "RateLimit-Remaining", "many"), ietf, "RateLimit-Remaining"},
		{"IETF 06: limit 0", header("RateLimit-Limit", "0", "RateLimit-Remaining", "0"), ietf, "is 0"},
	} {
		got, problem := upstream.ParseRateLimit(tc.h, tc.names)
		if got != upstream.NoReading || !strings.Contains(problem, tc.problem) {
			t.Errorf("%s: %+v %q, want no reading and a problem with %q", tc.name, got, problem, tc.problem)
		}
	}
}

// TestParseRateLimitProblemBounded: a problem quotes at most a bounded part
// of what the upstream sent.
func TestParseRateLimitProblemBounded(t *testing.T) {
	long := strings.Repeat("x", 10000)
	_, problem := upstream.ParseRateLimit(header("x-ratelimit-remaining-requests", long, "x-ratelimit-limit-requests", "5"), openAI)
	if problem == "" || len(problem) > 200 {
		t.Errorf("problem of %d bytes, want 1 to 200", len(problem))
	}
}

// FuzzParseRateLimit: no input panics, and a reading is either none or a
// valid one.
func FuzzParseRateLimit(f *testing.F) {
	f.Add("59", "60", `"default";r=50;t=30`, `"default";q=100;w=60`)
	f.Add("-1", "", "limit=100, remaining=50, reset=5", "")
	f.Add("", "", `a;r=1, b;r=2;x=?1;y=:AA==:, "c\"d";r=3`, `a;q=1, b;q=2.5, "c\"d";q=9`)
	f.Fuzz(func(t *testing.T, rem, lim, rl, rlp string) {
		h := http.Header{}
		for name, v := range map[string]string{"X-Ratelimit-Remaining-Requests": rem, "X-Ratelimit-Limit-Requests": lim, "Ratelimit": rl, "Ratelimit-Policy": rlp} {
			if v != "" {
				h[name] = []string{v}
			}
		}
		got, problem := upstream.ParseRateLimit(h, ietf)
		if got != upstream.NoReading && (!got.Known() || problem != "") {
			t.Fatalf("reading %+v with problem %q", got, problem)
		}
	})
}
