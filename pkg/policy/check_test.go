package policy_test

import (
	"bytes"
	"strings"
	"testing"

	"github.com/quotaplane/quotaplane/pkg/policy"
)

// Check, behind `enforcer check` and `quotactl check`: a summary line for a
// plane that compiles, every problem of one that does not, each prefixed
// with its directory.
func TestCheck(t *testing.T) {
	var out bytes.Buffer
	if !policy.Check(&out, "../../config/samples") {
		t.Fatalf("the samples do not check:\n%s", out.String())
	}
	if !strings.HasPrefix(out.String(), "../../config/samples: ok: plane default/main, 3 tiers, 3 endpoints, 6 tenants, burst pool: true, hash ") {
		t.Errorf("summary line: %q", out.String())
	}
	out.Reset()
	if policy.Check(&out, "../../config/samples", "testdata", "no-such-dir") {
		t.Fatalf("testdata (a misspelt field) and a missing directory passed:\n%s", out.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) < 3 || !strings.HasPrefix(lines[0], "../../config/samples: ok") ||
		!strings.HasPrefix(lines[1], "testdata: ") || !strings.HasPrefix(lines[len(lines)-1], "no-such-dir: ") {
		t.Errorf("every directory gets its lines, in order:\n%s", out.String())
	}
}

// LoadPath takes a directory or one file, and names the file in its errors.
func TestLoadPath(t *testing.T) {
	dir, err := policy.LoadPath("../../config/samples")
	if err != nil {
		t.Fatal(err)
	}
	file, err := policy.LoadPath("../../config/samples/quotaplane.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if file.ID() != dir.ID() || len(file.Spec().Tenants) != 0 || len(dir.Spec().Tenants) == 0 {
		t.Errorf("the plane's file alone: %s with %d tenants; the directory: %s with %d", file.ID(), len(file.Spec().Tenants), dir.ID(), len(dir.Spec().Tenants))
	}
	if _, err := policy.LoadPath("testdata/misspelt.yaml"); err == nil || !strings.Contains(err.Error(), `testdata/misspelt.yaml: document 3 (EndpointQuota)`) {
		t.Errorf("a file with a misspelt field: %v", err)
	}
	if _, err := policy.LoadPath("../../config/samples/tenants.yaml"); err == nil || !strings.Contains(err.Error(), "tenants.yaml: ") {
		t.Errorf("tenants without their plane: %v", err)
	}
	if _, err := policy.LoadPath("no-such"); err == nil {
		t.Error("a missing path loaded")
	}
}
