package policy_test

import (
	"bytes"
	"io/fs"
	"os"
	"reflect"
	"slices"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/quotaplane/quotaplane/config/samples"
	"github.com/quotaplane/quotaplane/pkg/policy"
)

// FuzzDecodeYAML feeds arbitrary bytes to DecodeYAML and whatever it decodes
// to Compile: neither may panic, a decoded object always has a name and a
// namespace, Compile returns a policy or a problem, and a policy always
// survives Encode/Decode with its hash and does not depend on object order.
func FuzzDecodeYAML(f *testing.F) {
	var all []byte
	files, err := fs.Glob(samples.FS, "*.yaml")
	if err != nil || len(files) == 0 {
		f.Fatalf("no sample files: %v", err)
	}
	for _, name := range files {
		data, err := fs.ReadFile(samples.FS, name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
		all = append(all, "\n---\n"...)
		all = append(all, data...)
	}
	f.Add(all) // the whole sample plane in one stream: compiles to a policy
	for _, name := range []string{"testdata/multidoc.yaml", "testdata/misspelt.yaml"} {
		data, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Add([]byte(""))
	f.Add([]byte("---\n# only a comment\n---\n"))
	f.Add([]byte(`{"apiVersion":"quotaplane.io/v1alpha1","kind":"QuotaPlane","metadata":{"name":"j"},"spec":{"global":{"rate":1},"tiers":[{"name":"t"}]}}`))
	f.Add([]byte(planeYAML + "---\n" + tenantYAML("a", "paid") + "---\n" + tenantYAML("a", "free")))

	f.Fuzz(func(t *testing.T, data []byte) {
		objs, err := policy.DecodeYAML(data)
		if err != nil {
			if objs != nil {
				t.Fatalf("DecodeYAML returned %d objects with error %v", len(objs), err)
			}
			return
		}
		for _, o := range objs {
			m, ok := o.(metav1.Object)
			if !ok || m.GetName() == "" || m.GetNamespace() == "" {
				t.Fatalf("decoded object %T without a name or namespace", o)
			}
		}

		p, problems := policy.Compile(objs)
		for _, pr := range problems {
			if pr.Kind == "" || pr.Message == "" {
				t.Errorf("problem without a kind or message: %+v", pr)
			}
		}
		if p == nil {
			if len(problems) == 0 {
				t.Fatal("Compile returned neither a policy nor a problem")
			}
			return
		}

		q, err := policy.Decode(p.WithVersion(3).Encode())
		if err != nil {
			t.Fatalf("Decode rejects what Compile produced: %v\n%s", err, p.Encode())
		}
		if q.Hash() != p.Hash() || q.Version() != 3 || !bytes.Equal(q.EncodedSpec(), p.EncodedSpec()) {
			t.Fatalf("round trip changed the policy: hash %s version %d, want %s 3", q.Hash(), q.Version(), p.Hash())
		}

		// Order independence holds for objects with distinct identities; a
		// stream may repeat a kind/namespace/name, which Kubernetes cannot.
		if distinctIdentities(objs) {
			rev := slices.Clone(objs)
			slices.Reverse(rev)
			r, rProblems := policy.Compile(rev)
			if r == nil || r.Hash() != p.Hash() || !reflect.DeepEqual(rProblems, problems) {
				t.Fatalf("reversed objects compile differently:\n%s\nwant\n%s", problemList(rProblems), problemList(problems))
			}
		}
	})
}

func distinctIdentities(objs []runtime.Object) bool {
	seen := map[string]bool{}
	for _, o := range objs {
		m := o.(metav1.Object)
		id := o.GetObjectKind().GroupVersionKind().Kind + "/" + m.GetNamespace() + "/" + m.GetName()
		if seen[id] {
			return false
		}
		seen[id] = true
	}
	return true
}
