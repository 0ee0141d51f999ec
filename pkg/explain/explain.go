// Package explain says why a tenant is throttled now, from an enforcer's
// admin API (GET /quota/debug?tenant=X, pkg/server): its limits level by
// level and what remains of each, its tier, weight, fair share and burst
// pool debt, its counters and its recent decisions, and, first, the
// reasons read from them (View.Why). `quotactl explain` prints it.
//
// It reads the enforcer's own view rather than Redis: the view is what
// decided (a local or local-reconciled enforcer's state is its own; in
// mode central the enforcer reads the fleet's state from Redis for it),
// and the admin API already guards it (loopback or a bearer token). Each
// enforcer answers for itself: in a distributed mode, ask the one the
// tenant's requests reach, or several.
package explain

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/quotaplane/quotaplane/pkg/report"
	"github.com/quotaplane/quotaplane/pkg/server"
)

// View is the JSON of GET /quota/debug?tenant=X, as the admin handler
// writes it; Limit, Decision, Fleet and Enforcer are its parts.
type (
	View     = server.DebugView
	Limit    = server.DebugLimit
	Decision = server.DebugDecision
	Fleet    = server.DebugFleet
	Enforcer = server.DebugEnforcer
)

// Explanation is a tenant's view with the reasons read from it.
type Explanation struct {
	Enforcer string   `json:"enforcer"`
	Why      []string `json:"why"`
	View     *View    `json:"view"`
}

// maxBody bounds the answer read.
const maxBody = 4 << 20

// Fetch asks the enforcer whose admin listener is at base (http://host:port)
// for tenant's view, with token as a bearer token when not empty.
func Fetch(ctx context.Context, client *http.Client, base, token, tenant string) (*Explanation, error) {
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("enforcer %q: want the admin listener's URL, such as http://127.0.0.1:9090", base)
	}
	u = u.JoinPath("/quota/debug")
	u.RawQuery = url.Values{"tenant": {tenant}}.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("cannot reach the enforcer's admin API: %w (is its -admin-listen there? from outside the pod: kubectl port-forward POD 9090)", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		return nil, fmt.Errorf("%s: read the answer: %w", u.Redacted(), err)
	}
	if resp.StatusCode != http.StatusOK {
		var e struct {
			Error string `json:"error"`
		}
		msg := strings.TrimSpace(string(body))
		if json.Unmarshal(body, &e) == nil && e.Error != "" {
			msg = e.Error
		}
		return nil, fmt.Errorf("%s answered %s: %s", u.Redacted(), resp.Status, msg)
	}
	var v View
	if err := json.Unmarshal(body, &v); err != nil {
		return nil, fmt.Errorf("%s: the answer is not a tenant's view: %w", u.Redacted(), err)
	}
	if v.Tenant == "" {
		return nil, errors.New(u.Redacted() + ": the answer names no tenant: is this an enforcer's admin listener?")
	}
	return &Explanation{Enforcer: base, View: &v, Why: Why(&v)}, nil
}

// Why lists why the tenant is (or is not) throttled, the most decisive
// first: an enforcer degraded, levels with nothing left, the last denial,
// demand above the fair share, debt to the burst pool.
func Why(v *View) []string {
	var why []string
	if v.Degraded {
		why = append(why, "the enforcer is degraded: Redis is unavailable and the plane's failure mode decides ("+v.Backend+")")
	}
	var lastDenial *Decision
	if i := slices.IndexFunc(v.Recent, func(d Decision) bool { return !d.Allowed }); i >= 0 {
		lastDenial = &v.Recent[i]
	}
	for _, l := range v.Limits {
		switch {
		case l.Remaining <= 0:
			why = append(why, fmt.Sprintf("the %s level%s is exhausted: %d tokens left of %s", l.Level, nameOf(l.Name), l.Remaining, l.Limit))
		case lastDenial != nil && lastDenial.Level == l.Level && l.Remaining < lastDenial.Cost:
			why = append(why, fmt.Sprintf("the %s level%s has %d tokens left of %s: fewer than the last denied request's cost, %d", l.Level, nameOf(l.Name), l.Remaining, l.Limit, lastDenial.Cost))
		}
	}
	if d := lastDenial; d != nil {
		why = append(why, fmt.Sprintf("its last denial (%s, %s, cost %d) was at the %s level: %s", d.At.Format(time.RFC3339), cmp.Or(d.Endpoint, "-"), d.Cost, d.Level, d.Reason))
	}
	if v.FairShare != nil && v.DemandPerSec > *v.FairShare {
		why = append(why, fmt.Sprintf("it asks %.0f tokens/s, above its fair share of %.0f tokens/s on the contended level (tier %s, weight %d): fairness holds it to its share", v.DemandPerSec, *v.FairShare, v.Tier, v.Weight))
	}
	if v.BorrowDebt > 0 {
		why = append(why, fmt.Sprintf("it owes %d tokens to the burst pool", v.BorrowDebt))
	}
	if !v.Known {
		why = append(why, fmt.Sprintf("the plane does not name it: it gets the %s tier's defaults", v.Tier))
	}
	if len(why) == 0 || (len(why) == 1 && !v.Known) {
		why = append([]string{"not throttled now: no level is exhausted and no recent decision was a denial"}, why...)
	}
	return why
}

func nameOf(name string) string {
	if name == "" {
		return ""
	}
	return " (" + name + ")"
}

// Tables are the reasons, the limits, the counters, the recent decisions
// and, in a distributed mode, the fleet.
func (x *Explanation) Tables() []report.Table {
	v := x.View
	known := "named by the plane"
	if !v.Known {
		known = "not named by the plane"
	}
	why := report.Table{Title: fmt.Sprintf("tenant %s: tier %s, weight %d, %s; policy version %d, mode %s, on %s", v.Tenant, v.Tier, v.Weight, known, v.PolicyVersion, v.Backend, x.Enforcer)}
	for _, w := range x.Why {
		why.Notes = append(why.Notes, "- "+w)
	}
	limits := report.Table{Title: "limits (" + v.LimitsNote + ")", Header: []string{"LEVEL", "NAME", "LIMIT", "REMAINING"}}
	for _, l := range v.Limits {
		limits.Rows = append(limits.Rows, []string{l.Level, cmp.Or(l.Name, "-"), l.Limit, strconv.FormatInt(l.Remaining, 10)})
	}
	share := "not contended"
	if v.FairShare != nil {
		share = fmt.Sprintf("%.1f tokens/s", *v.FairShare)
	}
	var denied []string
	for _, l := range slices.Sorted(maps.Keys(v.Denied)) {
		if v.Denied[l] > 0 {
			denied = append(denied, fmt.Sprintf("%s %d", l, v.Denied[l]))
		}
	}
	counters := report.Table{Title: "counters", Header: []string{"ADMITTED", "DENIED", "DEMAND", "FAIR SHARE", "BORROWED", "DEBT", "MAY BORROW"},
		Rows: [][]string{{strconv.FormatInt(v.Admitted, 10), cmp.Or(strings.Join(denied, ", "), "0"), fmt.Sprintf("%.1f tokens/s", v.DemandPerSec), share,
			strconv.FormatInt(v.Borrowed, 10), strconv.FormatInt(v.BorrowDebt, 10), strconv.FormatBool(v.MayBorrow)}}}
	recent := report.Table{Title: "recent decisions, newest first", Header: []string{"AT", "COUNT", "ENDPOINT", "COST", "ALLOWED", "LEVEL", "REASON"}}
	for _, d := range v.Recent {
		recent.Rows = append(recent.Rows, []string{d.At.Format(time.RFC3339Nano), strconv.FormatInt(d.Count, 10), cmp.Or(d.Endpoint, "-"), strconv.FormatInt(d.Cost, 10), strconv.FormatBool(d.Allowed), cmp.Or(d.Level, "-"), cmp.Or(d.Reason, "-")})
	}
	if len(v.Recent) == 0 {
		recent.Header, recent.Notes = nil, []string{"none on this enforcer"}
	}
	tables := []report.Table{why, limits, counters, recent}
	if v.Fleet != nil {
		fleet := report.Table{Title: fmt.Sprintf("fleet: %d live nodes", v.Fleet.LiveNodes), Header: []string{"ENFORCER", "VERSION", "MODE", "DEGRADED", "DECISIONS/s"}}
		for _, e := range v.Fleet.Enforcers {
			id, degraded := e.ID, "?"
			if e.Self {
				id += " (this one)"
			}
			if e.Degraded != nil {
				degraded = strconv.FormatBool(*e.Degraded)
			}
			fleet.Rows = append(fleet.Rows, []string{id, strconv.FormatInt(e.PolicyVersion, 10), cmp.Or(e.Mode, "?"), degraded, fmt.Sprintf("%.0f", e.DecisionsPerSec)})
		}
		if v.Fleet.Error != "" {
			fleet.Notes = []string{"the fleet's reports could not be read: " + v.Fleet.Error}
		}
		tables = append(tables, fleet)
	}
	return tables
}
