package quotaheaders_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/pkg/enforcer"
	"github.com/quotaplane/quotaplane/pkg/policy"
	"github.com/quotaplane/quotaplane/pkg/quotaheaders"
)

func TestSet(t *testing.T) {
	global := &policy.Limit{Rate: 10000, Burst: 20000, Period: time.Second, Algorithm: policy.TokenBucket}
	tenant := &policy.Limit{Rate: 50, Burst: 100, Period: time.Second, Algorithm: policy.TokenBucket}
	window := &policy.Limit{Rate: 100, Burst: 100, Period: 300 * time.Second, Algorithm: policy.SlidingWindow}
	limits := [len(enforcer.Levels)]*policy.Limit{global, tenant, window, nil}
	for _, tt := range []struct {
		name string
		d    enforcer.Decision
		want map[string]string
	}{
		{"allowed, bounded by the tenant", enforcer.Decision{Allow: true, Bound: enforcer.LevelTenant, Remaining: 40},
			map[string]string{
				"RateLimit-Policy": `"global";q=10000;w=1, "tenant";q=50;w=1, "endpoint";q=100;w=300`,
				"RateLimit":        `"tenant";r=40;t=2`, // 60 tokens at 50/s
				"Retry-After":      "", "X-Quota-Level": "", "X-Quota-Reason": "",
			}},
		{"allowed, bounded by a sliding window", enforcer.Decision{Allow: true, Bound: enforcer.LevelEndpoint, Remaining: 50},
			map[string]string{"RateLimit": `"endpoint";r=50;t=300`}},
		{"denied at the endpoint", enforcer.Decision{Level: enforcer.LevelEndpoint, Bound: enforcer.LevelEndpoint, RetryAfter: 1500 * time.Millisecond, Reason: "used up"},
			map[string]string{
				"RateLimit":      `"endpoint";r=0;t=2`,
				"Retry-After":    "2",
				"X-Quota-Level":  "endpoint",
				"X-Quota-Reason": "used up",
			}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			h := http.Header{}
			quotaheaders.Set(h, &limits, &tt.d)
			for name, want := range tt.want {
				if got := h.Get(name); got != want {
					t.Errorf("%s = %q; want %q", name, got, want)
				}
			}
		})
	}
}

func TestText(t *testing.T) {
	for _, tc := range []struct {
		in   string
		max  int
		want string
	}{
		{"plain", 10, "plain"},
		{"a\r\nb", 10, "a??b"},
		{"caf\xc3\xa9", 10, "caf??"},
		{"0123456789abc", 10, "0123456789"},
		{"", 10, ""},
	} {
		if got := quotaheaders.Text(tc.in, tc.max); got != tc.want {
			t.Errorf("Text(%q, %d) = %q; want %q", tc.in, tc.max, got, tc.want)
		}
	}
}

func TestRetryAfterSecondsRoundsUp(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
	}{{"1us", 1}, {"999ms", 1}, {"1s", 1}, {"1.001s", 2}, {"300s", 300}} {
		d, _ := time.ParseDuration(tc.in)
		if got := quotaheaders.RetryAfterSeconds(d); got != tc.want {
			t.Errorf("RetryAfterSeconds(%s) = %d; want %d", tc.in, got, tc.want)
		}
	}
}
