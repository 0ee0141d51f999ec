package main

import (
	"bytes"
	"context"
	"regexp"
	"strings"
	"testing"
)

// quotactl runs the command line args as the binary named arg0 would, and
// returns its exit code, stdout and stderr.
func quotactlAs(t *testing.T, arg0 string, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := run(context.Background(), append([]string{arg0}, args...), &out, &errOut)
	return code, out.String(), errOut.String()
}

func quotactl(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	return quotactlAs(t, "/usr/local/bin/quotactl", args...)
}

func TestHelpAndUsageErrors(t *testing.T) {
	code, out, _ := quotactl(t, "help")
	for _, c := range commands {
		if code != 0 || !strings.Contains(out, "quotactl "+c.name+" ") {
			t.Errorf("help (exit %d) does not list %s:\n%s", code, c.name, out)
		}
	}
	// As a kubectl plugin only the name in the help changes.
	if code, out, _ := quotactlAs(t, "/home/me/bin/kubectl-quota", "help"); code != 0 || !strings.Contains(out, "kubectl quota diff OLD NEW") {
		t.Errorf("kubectl-quota help (exit %d):\n%s", code, out)
	}
	if code, out, _ := quotactl(t, "simulate", "-h"); code != 0 || !strings.Contains(out, "-baseline") || !strings.Contains(out, "-profile") {
		t.Errorf("simulate -h (exit %d):\n%s", code, out)
	}
	if code, out, _ := quotactl(t, "help", "explain"); code != 0 || !strings.Contains(out, "-enforcer") {
		t.Errorf("help explain (exit %d):\n%s", code, out)
	}
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{nil, 2, "Usage:"},
		{[]string{"frobnicate"}, 2, `unknown command "frobnicate"`},
		{[]string{"check"}, 2, "name at least one directory"},
		{[]string{"diff", "a"}, 2, "want OLD and NEW"},
		{[]string{"diff", "-o", "yaml", "a", "b"}, 2, `-o "yaml": use table, json, markdown`},
		{[]string{"diff", "no-such-dir", "../../config/samples"}, 1, "OLD: stat no-such-dir"},
		{[]string{"simulate"}, 2, "--policy is required"},
		{[]string{"simulate", "--policy", "../../config/samples", "--duration", "0s"}, 2, "--duration 0s"},
		{[]string{"simulate", "--policy", "../../config/samples", "--profile", "nope.csv"}, 1, "give seed002 or a CSV file"},
		{[]string{"simulate", "--nosuchflag"}, 2, "flag provided but not defined: -nosuchflag"},
		{[]string{"explain"}, 2, "want one TENANT"},
		{[]string{"explain", "a b"}, 2, "printable ASCII"},
	} {
		code, _, errOut := quotactl(t, tc.args...)
		if code != tc.code || !strings.Contains(errOut, tc.want) {
			t.Errorf("%q: exit %d, stderr %q; want exit %d and %q", tc.args, code, errOut, tc.code, tc.want)
		}
	}
}

func TestCheck(t *testing.T) {
	code, out, _ := quotactl(t, "check", "../../config/samples")
	if code != 0 || !strings.Contains(out, "../../config/samples: ok: plane default/main, 3 tiers") {
		t.Errorf("check samples: exit %d\n%s", code, out)
	}
	code, out, _ = quotactl(t, "check", "../../pkg/policy/testdata")
	if code != 1 || !strings.Contains(out, "../../pkg/policy/testdata: ") {
		t.Errorf("check a directory with problems: exit %d\n%s", code, out)
	}
}

func TestDiffAndSimulate(t *testing.T) {
	code, out, _ := quotactl(t, "diff", "--exit-code", "../../config/samples", "../../config/samples")
	if code != 0 || !strings.Contains(out, "no change") {
		t.Errorf("diff of the same plane: exit %d\n%s", code, out)
	}
	// A plane against itself: the same requests, the same answers.
	code, out, errOut := quotactl(t, "simulate", "--policy", "../../config/samples", "--baseline", "../../config/samples",
		"--profile", "../../pkg/whatif/testdata/light.csv", "--duration", "2s", "-o", "markdown", "--top", "2")
	if code != 0 || !regexp.MustCompile(`\n\| free \| \d+ \| \d+ \| \+0\.0% \|`).MatchString(out) || !strings.Contains(out, "#### top 2 tenants by offered load") {
		t.Errorf("simulate -o markdown: exit %d, stderr %s\n%s", code, errOut, out)
	}
}
