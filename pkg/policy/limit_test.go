package policy_test

import (
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/api/v1alpha1"
	"github.com/quotaplane/quotaplane/pkg/policy"
)

// compileTierLimit compiles in as the gold tier's tenant limit.
func compileTierLimit(in v1alpha1.Limit) (*policy.Policy, []policy.Problem) {
	return policy.Compile(objects(newPlane(func(qp *v1alpha1.QuotaPlane) { qp.Spec.Tiers[0].Tenant = &in })))
}

func TestLimitDefaultsAndBounds(t *testing.T) {
	const field = "spec.tiers[0].tenant"
	sw := func(rate, burst int64, period time.Duration) v1alpha1.Limit {
		return v1alpha1.Limit{Rate: rate, Burst: burst, Period: dur(period), Algorithm: v1alpha1.SlidingWindow}
	}
	// 2^53 = 2^29 tokens × 2^24 µs: the largest scaled level the engine counts exactly.
	const boundBurst, boundPeriod = 1 << 29, (1 << 24) * time.Microsecond
	tests := []struct {
		name string
		in   v1alpha1.Limit
		want *policy.Limit // the compiled limit, when it is valid
		bad  []wantProblem // the problems, when it is not
	}{
		{name: "period defaults to 1s and burst to rate", in: *lim(100, 0), want: tb(100, 100, time.Second)},
		{name: "burst defaults to 1 when rate is 0", in: *lim(0, 0), want: tb(0, 1, time.Second)},
		{name: "rate 0 with a burst is a fixed allowance", in: *lim(0, 5), want: tb(0, 5, time.Second)},
		{name: "explicit values are kept", in: *limPer(100, 250, time.Minute), want: tb(100, 250, time.Minute)},
		{name: "explicit tokenBucket", in: v1alpha1.Limit{Rate: 3, Burst: 4, Algorithm: v1alpha1.TokenBucket}, want: tb(3, 4, time.Second)},
		{name: "period at MinPeriod", in: *limPer(1, 1, policy.MinPeriod), want: tb(1, 1, time.Millisecond)},
		{name: "period in whole microseconds", in: *limPer(1, 1, 1500*time.Microsecond), want: tb(1, 1, 1500*time.Microsecond)},
		{name: "period at MaxPeriod", in: *limPer(1, 1, policy.MaxPeriod), want: tb(1, 1, policy.MaxPeriod)},
		{name: "rate and burst at MaxRate", in: *lim(policy.MaxRate, policy.MaxRate), want: tb(policy.MaxRate, policy.MaxRate, time.Second)},
		{name: "burst defaults to a rate of MaxRate", in: *lim(policy.MaxRate, 0), want: tb(policy.MaxRate, policy.MaxRate, time.Second)},
		{
			name: "slidingWindow burst is its rate",
			in:   sw(5, 999, 5*time.Minute),
			want: &policy.Limit{Rate: 5, Burst: 5, Period: 5 * time.Minute, Algorithm: policy.SlidingWindow},
		},
		{
			name: "slidingWindow period defaults to 1s",
			in:   v1alpha1.Limit{Rate: 2, Algorithm: v1alpha1.SlidingWindow},
			want: &policy.Limit{Rate: 2, Burst: 2, Period: time.Second, Algorithm: policy.SlidingWindow},
		},
		{
			name: "slidingWindow rate at its maximum",
			in:   sw(policy.MaxSlidingWindowRate, 0, time.Second),
			want: &policy.Limit{Rate: 10000, Burst: 10000, Period: time.Second, Algorithm: policy.SlidingWindow},
		},
		{name: "burst × period exactly 2^53", in: *limPer(1, boundBurst, boundPeriod), want: tb(1, boundBurst, boundPeriod)},

		{
			name: "slidingWindow rate 0",
			in:   sw(0, 0, time.Second),
			bad:  []wantProblem{planeProblem(field+".rate", "slidingWindow keeps one entry per request", "rate must be 1 to 10000", "use tokenBucket")},
		},
		{
			name: "slidingWindow rate above its maximum",
			in:   sw(policy.MaxSlidingWindowRate+1, 0, time.Second),
			bad:  []wantProblem{planeProblem(field+".rate", "1 to 10000")},
		},
		{
			name: "negative slidingWindow rate is out of range",
			in:   sw(-1, 0, time.Second),
			bad:  []wantProblem{planeProblem(field+".rate", "rate -1 is out of range")},
		},
		{
			name: "negative rate",
			in:   *lim(-1, 10),
			bad:  []wantProblem{planeProblem(field+".rate", "rate -1 is out of range", "use 0 to 1000000000 tokens per period", "0 means no refill")},
		},
		{
			name: "rate above MaxRate, and so its default burst",
			in:   *lim(policy.MaxRate+1, 0),
			bad: []wantProblem{
				planeProblem(field+".burst", "burst 1000000001 is out of range"),
				planeProblem(field+".rate", "rate 1000000001 is out of range"),
			},
		},
		{
			name: "burst above MaxRate",
			in:   *lim(10, policy.MaxRate+1),
			bad:  []wantProblem{planeProblem(field+".burst", "burst 1000000001 is out of range", "use 1 to 1000000000")},
		},
		{
			name: "negative burst",
			in:   *lim(10, -1),
			bad:  []wantProblem{planeProblem(field+".burst", "burst -1 is out of range")},
		},
		{
			name: "period below MinPeriod",
			in:   *limPer(1, 1, policy.MinPeriod-time.Microsecond),
			bad:  []wantProblem{planeProblem(field+".period", "period 999µs is out of range", "use 1ms to 8784h0m0s")},
		},
		{
			name: "period of zero",
			in:   *limPer(1, 1, 0),
			bad:  []wantProblem{planeProblem(field+".period", "period 0s is out of range")},
		},
		{
			name: "negative period",
			in:   *limPer(1, 1, -time.Second),
			bad:  []wantProblem{planeProblem(field+".period", "period -1s is out of range")},
		},
		{
			name: "period above MaxPeriod",
			in:   *limPer(1, 1, policy.MaxPeriod+time.Microsecond),
			bad:  []wantProblem{planeProblem(field+".period", "out of range")},
		},
		{
			name: "sub-microsecond period",
			in:   *limPer(1, 1, time.Second+500*time.Nanosecond),
			bad:  []wantProblem{planeProblem(field+".period", "period 1.0000005s has sub-microsecond precision", "round it to whole microseconds")},
		},
		{
			name: "sub-microsecond period just above MinPeriod",
			in:   *limPer(1, 1, policy.MinPeriod+time.Nanosecond),
			bad:  []wantProblem{planeProblem(field+".period", "sub-microsecond precision")},
		},
		{
			name: "burst one above 2^53 / period",
			in:   *limPer(1, boundBurst+1, boundPeriod),
			bad:  []wantProblem{planeProblem(field, "burst 536870913 × period 16.777216s is too large to count exactly", "at most 2^53", "shorten the period or lower the burst")},
		},
		{
			name: "period one µs above 2^53 / burst",
			in:   *limPer(1, boundBurst, boundPeriod+time.Microsecond),
			bad:  []wantProblem{planeProblem(field, "too large to count exactly")},
		},
		{
			name: "MaxRate burst over 10s",
			in:   *limPer(policy.MaxRate, policy.MaxRate, 10*time.Second),
			bad:  []wantProblem{planeProblem(field, "too large")},
		},
		{
			name: "a million tokens over MaxPeriod",
			in:   *limPer(1, 1_000_000, policy.MaxPeriod),
			bad:  []wantProblem{planeProblem(field, "too large")},
		},
		{
			name: "unknown algorithm",
			in:   v1alpha1.Limit{Rate: 1, Algorithm: "gcra"},
			bad:  []wantProblem{planeProblem(field+".algorithm", `"gcra" is not an algorithm`, "use tokenBucket or slidingWindow")},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, problems := compileTierLimit(tt.in)
			if tt.want == nil {
				if p != nil {
					t.Errorf("the plane compiled with an invalid tier limit")
				}
				checkProblems(t, problems, tt.bad)
				return
			}
			if len(problems) > 0 || p == nil {
				t.Fatalf("problems:\n%s", problemList(problems))
			}
			tier, _ := p.Tier("gold")
			if tier.Tenant == nil || *tier.Tenant != *tt.want {
				t.Errorf("limit = %+v, want %+v", tier.Tenant, *tt.want)
			}
			// Every accepted limit also passes Decode's own check.
			if _, err := policy.Decode(p.Encode()); err != nil {
				t.Errorf("Decode rejects a limit Compile accepts: %v", err)
			}
		})
	}
}

func TestLimitString(t *testing.T) {
	tests := []struct {
		l    policy.Limit
		want string
	}{
		{*tb(100, 200, time.Second), "100 per 1s (burst 200)"},
		{*tb(0, 3, time.Second), "3 in total (no refill)"},
		{*tb(20, 10, time.Minute), "20 per 1m0s (burst 10)"},
		{policy.Limit{Rate: 2, Burst: 2, Period: 5 * time.Minute, Algorithm: policy.SlidingWindow}, "2 per 5m0s (sliding window)"},
	}
	for _, tt := range tests {
		if got := tt.l.String(); got != tt.want {
			t.Errorf("%+v.String() = %q, want %q", tt.l, got, tt.want)
		}
	}
}

func TestLimitPeriodMicros(t *testing.T) {
	tests := []struct {
		period time.Duration
		want   int64
	}{
		{time.Millisecond, 1000},
		{time.Second, 1_000_000},
		{1500 * time.Microsecond, 1500},
		{policy.MaxPeriod, 366 * 24 * 3600 * 1_000_000},
	}
	for _, tt := range tests {
		if got := tb(1, 1, tt.period).PeriodMicros(); got != tt.want {
			t.Errorf("PeriodMicros(%s) = %d, want %d", tt.period, got, tt.want)
		}
	}
}
