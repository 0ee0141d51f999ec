package policy_test

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/runtime"

	"github.com/quotaplane/quotaplane/pkg/policy"
)

// reencode edits a policy's encoded spec as JSON and wraps it with a hash
// that matches, as a hand-edited or foreign blob in Redis would be.
func reencode(t *testing.T, p *policy.Policy, edit func(map[string]any)) []byte {
	t.Helper()
	var spec map[string]any
	if err := json.Unmarshal(p.EncodedSpec(), &spec); err != nil {
		t.Fatal(err)
	}
	edit(spec)
	enc, _ := json.Marshal(spec)
	var typed policy.Spec
	if err := json.Unmarshal(enc, &typed); err != nil {
		t.Fatal(err)
	}
	canon, _ := json.Marshal(&typed)
	sum := sha256.Sum256(canon)
	out, _ := json.Marshal(map[string]any{"version": 7, "hash": hex.EncodeToString(sum[:]), "spec": json.RawMessage(enc)})
	return out
}

// TestDecodeRejectsWhatCompileRejects: a blob with a valid hash is still
// checked against what Compile allows, since the engine trusts it (an
// unknownTenants of "Deny" would otherwise fail open).
func TestDecodeRejectsWhatCompileRejects(t *testing.T) {
	p, err := policy.LoadDir("../../config/samples")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := policy.Decode(reencode(t, p, func(map[string]any) {})); err != nil {
		t.Fatalf("the unedited samples do not decode: %v", err)
	}
	cases := map[string]func(map[string]any){
		"unknownTenants Deny": func(s map[string]any) { s["unknownTenants"] = "Deny" },
		"fairness typo":       func(s map[string]any) { s["fairness"] = "max-min" },
		"mode typo":           func(s map[string]any) { s["mode"] = "centrall" },
		"global sliding window": func(s map[string]any) {
			s["global"].(map[string]any)["algorithm"] = "slidingWindow"
			s["global"].(map[string]any)["rate"] = 100
		},
		"pool size 2^40": func(s map[string]any) {
			s["burstPool"].(map[string]any)["size"] = int64(1) << 40
			s["burstPool"].(map[string]any)["perTenantCeiling"] = int64(1) << 40
		},
		"tenant weight 1e12":     func(s map[string]any) { s["tenants"].([]any)[0].(map[string]any)["weight"] = 1e12 },
		"tenant name with space": func(s map[string]any) { s["tenants"].([]any)[0].(map[string]any)["name"] = "acme corp" },
		"reconcileInterval 0":    func(s map[string]any) { s["reconcileInterval"] = 0 },
	}
	for name, edit := range cases {
		if _, err := policy.Decode(reencode(t, p, edit)); err == nil {
			t.Errorf("%s: Decode accepted it", name)
		}
	}
}

// TestSameObjectTwiceIsLeftOutInAnyOrder: two objects of one kind,
// namespace and name (files can hold them) are both reported and left out,
// so the result does not depend on their order.
func TestSameObjectTwiceIsLeftOutInAnyOrder(t *testing.T) {
	a := newTenant("acme", "acme", "")
	b := newTenant("acme", "acme-other", "")
	var hashes []string
	for _, order := range [][]runtime.Object{{newPlane(), a, b}, {b, newPlane(), a}} {
		p, problems := policy.Compile(order)
		if p == nil || len(problems) != 2 || problems[0].Name != "acme" || !strings.Contains(problems[0].Message, "defined 2 times") {
			t.Fatalf("problems %v; want both copies of TenantQuota acme reported", problems)
		}
		if len(p.Spec().Tenants) != 0 {
			t.Errorf("tenants %v; want neither copy", tenantNames(p))
		}
		hashes = append(hashes, p.Hash())
	}
	if hashes[0] != hashes[1] {
		t.Errorf("hashes %v differ with the order of the objects", hashes)
	}
}
