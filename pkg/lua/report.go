package lua

import (
	"context"
	"strconv"

	"github.com/redis/go-redis/v9"
)

// Report records an enforcer's report in its plane's fleet on Redis's
// clock and drops the lapsed ones; see report.lua for its contract.
// RunReport is its typed form.
var Report = load("report.lua")

// ReportArgs are the arguments of one call of Report.
type ReportArgs struct {
	ID      string // the enforcer's id
	Version int64  // the policy version it runs
	Rate    float64
	TTLMs   int64  // the report lapses this long after Redis's now, >= 1
	State   string // "mode:0" or "mode:1", or "" for none
}

// RunReport calls Report on the plane's reports and states hashes and
// returns how many reports it dropped.
func RunReport(ctx context.Context, c redis.Scripter, reports, states string, a ReportArgs) (int64, error) {
	value := strconv.FormatInt(a.Version, 10) + ":" + strconv.FormatFloat(a.Rate, 'g', -1, 64)
	return Report.Run(ctx, c, []string{reports, states}, a.ID, value, a.TTLMs, a.State).Int64()
}
