package whatif_test

import (
	"bytes"
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/quotaplane/quotaplane/pkg/policy"
	"github.com/quotaplane/quotaplane/pkg/report"
	"github.com/quotaplane/quotaplane/pkg/whatif"
)

func TestCompareSamplesWithThemselves(t *testing.T) {
	p, err := policy.LoadPath("../../config/samples")
	if err != nil {
		t.Fatal(err)
	}
	d := whatif.Compare("a", p, "b", p)
	if !d.Empty() {
		t.Fatalf("the samples against themselves: %+v", d.Changes)
	}
	var out bytes.Buffer
	if err := report.Write(&out, "table", d); err != nil || !strings.Contains(out.String(), "no change") {
		t.Errorf("table of no change: %q, %v", out.String(), err)
	}
}

func TestCompareLevelByLevel(t *testing.T) {
	old, err := policy.LoadPath("../../config/samples")
	if err != nil {
		t.Fatal(err)
	}
	dir := samplesWith(t,
		halveFree,
		edit{"quotaplane.yaml", "mode: local", "mode: central"},
		edit{"quotaplane.yaml", "failureMode: degrade", "failureMode: deny"},
		edit{"quotaplane.yaml", "global: {rate: 10000, burst: 20000}", "global: {rate: 12000, burst: 20000}"},
		edit{"quotaplane.yaml", "weight: 4\n", "weight: 5\n"},
		edit{"burstpool.yaml", "size: 5000", "size: 6000"},
		edit{"endpoints.yaml", "cost: 50", "cost: 40"},
		// globex moves from standard to enterprise; acme's partner key halves;
		// initech is deleted; a new free tenant arrives.
		edit{"tenants.yaml", "  tenant: globex\n  tier: standard", "  tenant: globex\n  tier: enterprise"},
		edit{"tenants.yaml", "limit: {rate: 10, burst: 20}", "limit: {rate: 5, burst: 20}"},
		edit{"tenants.yaml", "  name: initech\nspec:\n  tenant: initech\n  tier: standard\n  weight: 6", "  name: newco\nspec:\n  tenant: newco\n  tier: free"},
	)
	new, err := policy.LoadPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	d := whatif.Compare("old", old, "new", new)
	want := []whatif.Change{
		{Level: "plane", Field: "mode", Old: "local", New: "central"},
		{Level: "plane", Field: "failureMode", Old: "degrade", New: "deny"},
		{Level: "global", Field: "limit", Old: "10000 per 1s (burst 20000)", New: "12000 per 1s (burst 20000)"},
		{Level: "tier", Object: "free", Field: "tenant limit", Old: "50 per 1s (burst 100)", New: "25 per 1s (burst 50)"},
		{Level: "tier", Object: "standard", Field: "weight", Old: "4", New: "5"},
		{Level: "burstPool", Field: "size", Old: "5000", New: "6000"},
		{Level: "endpoint", Object: "export", Field: "cost", Old: "50", New: "40"},
		{Level: "tenant", Object: "free-trial", Field: "limit", Old: "50 per 1s (burst 100)", New: "25 per 1s (burst 50)"},
		{Level: "tenant", Object: "globex", Field: "tier", Old: "standard", New: "enterprise"},
		{Level: "tenant", Object: "globex", Field: "limit", Old: "500 per 1s (burst 1000)", New: "2000 per 1s (burst 4000)"},
		{Level: "tenant", Object: "globex", Field: "weight", Old: "4", New: "8"},
		{Level: "tenant", Object: "initech", Field: "tenant", Old: "tier standard, limit 500 per 1s (burst 1000), weight 6", New: ""},
		{Level: "tenant", Object: "newco", Field: "tenant", Old: "", New: "tier free, limit 25 per 1s (burst 50), weight 1"},
		{Level: "key", Object: "acme/acme-partner", Field: "limit", Old: "10 per 1s (burst 20)", New: "5 per 1s (burst 20)"},
	}
	for _, w := range want {
		if !slices.Contains(d.Changes, w) {
			t.Errorf("missing change %+v", w)
		}
	}
	// Levels come in DiffLevels' order.
	for i := 1; i < len(d.Changes); i++ {
		if slices.Index(whatif.DiffLevels, d.Changes[i-1].Level) > slices.Index(whatif.DiffLevels, d.Changes[i].Level) {
			t.Errorf("change %d (%s) listed after %s", i, d.Changes[i].Level, d.Changes[i-1].Level)
		}
	}
	tiers := map[string]whatif.TierTenants{}
	for _, tt := range d.Tiers {
		tiers[tt.Tier] = tt
	}
	wantTiers := map[string]whatif.TierTenants{
		"enterprise": {Tier: "enterprise", Before: 2, After: 3, Added: 1},
		// acme changed (its key); globex moved out; initech deleted.
		"standard": {Tier: "standard", Before: 3, After: 1, Removed: 2, Changed: 1},
		"free":     {Tier: "free", Before: 1, After: 2, Added: 1, Changed: 1, DefaultsChanged: true},
	}
	for name, w := range wantTiers {
		if tiers[name] != w {
			t.Errorf("tier %s: %+v, want %+v", name, tiers[name], w)
		}
	}
	if d.Tiers[0].Tier != "enterprise" || d.Tiers[2].Tier != "free" {
		t.Errorf("tiers out of priority order: %+v", d.Tiers)
	}

	// Every format carries the changes.
	var md, js bytes.Buffer
	if err := report.Write(&md, "markdown", d); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(md.String(), "| LEVEL | OBJECT | FIELD | OLD | NEW |\n| --- | --- | --- | --- | --- |\n") ||
		!strings.Contains(md.String(), "| tier | free | tenant limit | 50 per 1s (burst 100) | 25 per 1s (burst 50) |") {
		t.Errorf("markdown:\n%s", md.String())
	}
	if err := report.Write(&js, "json", d); err != nil {
		t.Fatal(err)
	}
	var back whatif.Diff
	if err := json.Unmarshal(js.Bytes(), &back); err != nil || len(back.Changes) != len(d.Changes) || back.New.Hash != new.Hash() {
		t.Errorf("json round trip: %v, %d changes, want %d", err, len(back.Changes), len(d.Changes))
	}
	if err := report.Write(&js, "yaml", d); err == nil || !strings.Contains(err.Error(), "table, json, markdown") {
		t.Errorf("format yaml: %v", err)
	}
}
