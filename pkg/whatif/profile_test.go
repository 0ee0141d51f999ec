package whatif_test

import (
	"strings"
	"testing"

	"github.com/quotaplane/quotaplane/pkg/load"
	"github.com/quotaplane/quotaplane/pkg/whatif"
)

func TestReadProfile(t *testing.T) {
	got, err := whatif.ReadProfile(strings.NewReader("# comment\ntenant,tier,rate\nacme,standard,12.5\nbob,,3\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := []load.TenantRate{{Name: "acme", Tier: "standard", Rate: 12.5}, {Name: "bob", Rate: 3}}
	if len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Errorf("got %+v, want %+v", got, want)
	}
	// A tenants.csv written by load -out: its offered_per_s is the rate.
	got, err = whatif.ReadProfile(strings.NewReader("tenant,tier,rank,offered_per_s,admitted_per_s\nwhale-1,enterprise,1,21000.5,400\n"))
	if err != nil || len(got) != 1 || got[0].Rate != 21000.5 || got[0].Tier != "enterprise" {
		t.Errorf("load's tenants.csv: %+v, %v", got, err)
	}
	for _, tc := range []struct{ in, want string }{
		{"", "empty"},
		{"name,rate\n", "want the columns tenant and rate"},
		{"tenant,rate\n", "no tenants"},
		{"tenant,rate\nacme,fast\n", `line 2: rate "fast": not a number`},
		{"tenant,rate\nac me,1\n", `line 2: tenant "ac me"`},
		{"tenant,rate\nacme,1,2\n", "line 2: 3 fields"},
	} {
		if _, err := whatif.ReadProfile(strings.NewReader(tc.in)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want one with %q", tc.in, err, tc.want)
		}
	}
}

func TestLoadProfileErrors(t *testing.T) {
	if _, _, err := whatif.LoadProfile("no-such.csv", 0, 0); err == nil || !strings.Contains(err.Error(), "seed002") {
		t.Errorf("a missing file: %v", err)
	}
	dir := t.TempDir() + "/dup.csv"
	writeFile(t, dir, "tenant,rate\nacme,1\nacme,2\n")
	if _, _, err := whatif.LoadProfile(dir, 0, 0); err == nil || !strings.Contains(err.Error(), "listed twice") {
		t.Errorf("a tenant twice: %v", err)
	}
	writeFile(t, dir, "tenant,rate\nacme,0\n")
	if _, _, err := whatif.LoadProfile(dir, 0, 0); err == nil || !strings.Contains(err.Error(), "offer nothing") {
		t.Errorf("no load: %v", err)
	}
	b, _, err := whatif.LoadProfile(whatif.ProfileSeed002, 0, 7)
	if err != nil || len(b.Tenants) != 5000 || b.Seed != 7 || b.Duration != load.Seed002().Duration {
		t.Errorf("seed002 with seed 7: %v", err)
	}
}
