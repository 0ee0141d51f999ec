package load

import (
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/quotaplane/quotaplane/pkg/policy"
)

// Result is what a run measured.
type Result struct {
	Profile string  `json:"profile"`
	Wall    float64 `json:"wallSeconds"`
	// OfferedPerSec is the rate decisions were actually made at over the
	// wall time (in virtual time, how fast the engine replayed the run).
	DecisionsPerWallSec float64                `json:"decisionsPerWallSecond"`
	Measured            float64                `json:"measuredSeconds"` // after the warmup
	Totals              TenantCount            `json:"totals"`          // after the warmup
	Tiers               map[string]TenantCount `json:"tiers"`           // after the warmup
	Tenants             []TenantResult         `json:"-"`               // in tenants.csv
	Seconds             []SecondResult         `json:"-"`               // in seconds.csv
	WallSeconds         []WallSecond           `json:"-"`               // in tokens.csv; real time only
	// AdmittedTokensPerWallSec is every admitted token over the wall time
	// (real time only): against a global limit, it is what was enforced.
	AdmittedTokensPerWallSec float64 `json:"admittedTokensPerWallSecond,omitempty"`
	// Scheduled is the run's length as scheduled, in seconds.
	Scheduled float64 `json:"scheduledSeconds"`
	// GlobalLimitPerSec and GlobalOverage are set by AgainstLimit.
	GlobalLimitPerSec float64   `json:"globalLimitPerSecond,omitempty"`
	GlobalOverage     float64   `json:"globalOverage,omitempty"`
	Latency           Quantiles `json:"latency"`
	VictimLatency     Quantiles `json:"victimLatency"`
	Lag               Quantiles `json:"generatorLag"`
	OracleChecked     int64     `json:"oracleChecked,omitempty"`
	OracleMismatches  int64     `json:"oracleMismatches,omitempty"`
	Errors            int64     `json:"errors"`

	// admittedTokens is every token admitted in the run, warmup included:
	// the same decisions whether counted by scheduled or by wall second.
	admittedTokens int64
}

// Quantiles of a latency distribution, in microseconds.
type Quantiles struct {
	P50  float64 `json:"p50us"`
	P99  float64 `json:"p99us"`
	P999 float64 `json:"p999us"`
}

func quantiles(h *Histogram) Quantiles {
	us := func(d time.Duration) float64 { return float64(d) / 1e3 }
	return Quantiles{us(h.Quantile(0.5)), us(h.Quantile(0.99)), us(h.Quantile(0.999))}
}

// TenantResult is one tenant's counts after the warmup.
type TenantResult struct {
	Tenant
	TenantCount
}

// SecondResult is one second of the time series.
type SecondResult struct {
	Second
	T                              int
	P50, P99, VictimP50, VictimP99 time.Duration
	LagP99                         time.Duration
}

func newResult(b *Built, o *Options, c *counts, wall time.Duration) *Result {
	r := &Result{Profile: b.Summary(), Wall: wall.Seconds(), Tiers: map[string]TenantCount{},
		Measured: b.Duration.Seconds() - o.Warmup.Seconds(), Scheduled: b.Duration.Seconds()}
	for i, tc := range c.tenants {
		r.Tenants = append(r.Tenants, TenantResult{b.Tenants[i], tc})
		tier := r.Tiers[b.Tenants[i].Tier]
		tier.add(&tc)
		r.Tiers[b.Tenants[i].Tier] = tier
		r.Totals.add(&tc)
	}
	var all, victims, lag Histogram
	var decisions int64
	for i, s := range c.seconds {
		all.Merge(&s.Latency)
		victims.Merge(&s.VictimLatency)
		lag.Merge(&s.Lag)
		decisions += s.Offered + s.Errors
		r.OracleChecked += s.OracleChecked
		r.OracleMismatches += s.OracleMismatches
		r.Errors += s.Errors
		r.admittedTokens += s.AdmittedTokens
		r.Seconds = append(r.Seconds, SecondResult{Second: s, T: i,
			P50: s.Latency.Quantile(0.5), P99: s.Latency.Quantile(0.99),
			VictimP50: s.VictimLatency.Quantile(0.5), VictimP99: s.VictimLatency.Quantile(0.99),
			LagP99: s.Lag.Quantile(0.99)})
	}
	if !o.Virtual {
		// Up to the last second that saw a decision.
		n := len(c.wall)
		for n > 0 && c.wall[n-1].Decided == 0 {
			n--
		}
		r.WallSeconds = c.wall[:n]
		r.AdmittedTokensPerWallSec = float64(r.admittedTokens) / wall.Seconds()
	}
	r.Latency, r.VictimLatency, r.Lag = quantiles(&all), quantiles(&victims), quantiles(&lag)
	r.DecisionsPerWallSec = float64(decisions) / wall.Seconds()
	return r
}

// AgainstLimit compares every admitted token of the run, warmup included,
// with the global limit l: GlobalOverage = admitted / (rate × elapsed +
// burst) − 1, the bucket starting full, where elapsed is the wall time in
// real time (the clock the limit refills on, longer than the schedule when
// the run fell behind) and the scheduled time in virtual time. Negative
// means under the limit.
func (r *Result) AgainstLimit(l *policy.Limit) {
	elapsed := r.Wall
	if len(r.WallSeconds) == 0 {
		elapsed = r.Scheduled
	}
	r.GlobalLimitPerSec = limitPerSecond(l)
	r.GlobalOverage = float64(r.admittedTokens)/(r.GlobalLimitPerSec*elapsed+float64(l.Burst)) - 1
}

// Write stores the result in dir: summary.json, tenants.csv (every tenant),
// seconds.csv (the time series by scheduled second) and, for a real-time
// run, tokens.csv (by second of wall time: admitted and offered tokens,
// decisions).
func (r *Result) Write(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	summary, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "summary.json"), append(summary, '\n'), 0o644); err != nil {
		return err
	}
	f := func(x float64) string { return strconv.FormatFloat(x, 'f', -1, 64) }
	i := func(x int64) string { return strconv.FormatInt(x, 10) }
	us := func(d time.Duration) string { return f(float64(d) / 1e3) }
	per := r.Measured
	if err := WriteCSV(filepath.Join(dir, "tenants.csv"),
		[]string{"tenant", "tier", "rank", "profile_rate", "offered_per_s", "admitted_per_s", "denied_global", "denied_tenant", "denied_endpoint", "denied_key", "borrowed",
			"offered_tokens_per_s", "admitted_tokens_per_s"},
		len(r.Tenants), func(k int) []string {
			t := r.Tenants[k]
			return []string{t.Name, t.Tier, strconv.Itoa(t.Rank), f(t.Rate), f(float64(t.Offered) / per), f(float64(t.Admitted) / per),
				i(t.Denied[0]), i(t.Denied[1]), i(t.Denied[2]), i(t.Denied[3]), i(t.Borrowed),
				f(float64(t.OfferedTokens) / per), f(float64(t.AdmittedTokens) / per)}
		}); err != nil {
		return err
	}
	if err := WriteCSV(filepath.Join(dir, "seconds.csv"),
		[]string{"t", "offered", "admitted", "victim_offered", "victim_admitted", "victim_denied_global", "attacker_offered", "attacker_admitted", "borrowed",
			"p50_us", "p99_us", "victim_p50_us", "victim_p99_us", "lag_p99_us", "oracle_checked", "oracle_mismatches", "errors",
			"offered_tokens", "admitted_tokens"},
		len(r.Seconds), func(k int) []string {
			s := r.Seconds[k]
			return []string{strconv.Itoa(s.T), i(s.Offered), i(s.Admitted), i(s.VictimOffered), i(s.VictimAdmitted), i(s.VictimDeniedGlobal),
				i(s.AttackerOffered), i(s.AttackerAdmitted), i(s.Borrowed), us(s.P50), us(s.P99), us(s.VictimP50), us(s.VictimP99), us(s.LagP99),
				i(s.OracleChecked), i(s.OracleMismatches), i(s.Errors), i(s.OfferedTokens), i(s.AdmittedTokens)}
		}); err != nil {
		return err
	}
	if len(r.WallSeconds) == 0 {
		return nil
	}
	return WriteCSV(filepath.Join(dir, "tokens.csv"), []string{"t", "admitted_tokens", "offered_tokens", "decided"},
		len(r.WallSeconds), func(k int) []string {
			w := r.WallSeconds[k]
			return []string{strconv.Itoa(k), i(w.AdmittedTokens), i(w.OfferedTokens), i(w.Decided)}
		})
}

// WriteCSV writes a CSV file of header and n rows.
func WriteCSV(path string, header []string, n int, row func(int) []string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := csv.NewWriter(f)
	_ = w.Write(header)
	for k := range n {
		_ = w.Write(row(k))
	}
	w.Flush()
	if err := w.Error(); err != nil {
		f.Close()
		return fmt.Errorf("%s: %w", path, err)
	}
	return f.Close()
}

// Print writes a short human summary.
func (r *Result) Print(w io.Writer) {
	fmt.Fprintf(w, "profile: %s\n", r.Profile)
	fmt.Fprintf(w, "decided %d requests in %.1fs of wall time (%.0f/s); errors %d\n", r.Totals.Offered, r.Wall, r.DecisionsPerWallSec, r.Errors)
	rate := func(n int64) float64 { return float64(n) / r.Measured }
	fmt.Fprintf(w, "after the warmup: offered %.0f/s, admitted %.0f/s; denied/s global %.0f, tenant %.0f, endpoint %.0f, key %.0f",
		rate(r.Totals.Offered), rate(r.Totals.Admitted), rate(r.Totals.Denied[0]), rate(r.Totals.Denied[1]), rate(r.Totals.Denied[2]), rate(r.Totals.Denied[3]))
	if r.Totals.DeniedUpstream > 0 {
		fmt.Fprintf(w, ", upstream %.0f", rate(r.Totals.DeniedUpstream))
	}
	fmt.Fprintln(w)
	for _, tier := range Tiers {
		t := r.Tiers[tier]
		fmt.Fprintf(w, "  %-10s offered %9.0f/s admitted %9.0f/s\n", tier, rate(t.Offered), rate(t.Admitted))
	}
	if r.AdmittedTokensPerWallSec > 0 {
		fmt.Fprintf(w, "admitted %.0f tokens/s over the wall time\n", r.AdmittedTokensPerWallSec)
	}
	if r.GlobalLimitPerSec > 0 {
		fmt.Fprintf(w, "global limit %.0f tokens/s: the run admitted %+.2f%% against limit × time + burst\n", r.GlobalLimitPerSec, 100*r.GlobalOverage)
	}
	fmt.Fprintf(w, "latency p50 %.1fµs p99 %.1fµs; victims p50 %.1fµs p99 %.1fµs; generator lag p99 %.1fµs\n",
		r.Latency.P50, r.Latency.P99, r.VictimLatency.P50, r.VictimLatency.P99, r.Lag.P99)
	if r.OracleChecked > 0 {
		fmt.Fprintf(w, "oracle: %d decisions checked, %d disagreements (%.4f%% agree)\n", r.OracleChecked, r.OracleMismatches,
			100*float64(r.OracleChecked-r.OracleMismatches)/float64(r.OracleChecked))
	}
}
