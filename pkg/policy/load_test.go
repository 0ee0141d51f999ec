package policy_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/quotaplane/quotaplane/api/v1alpha1"
	"github.com/quotaplane/quotaplane/config/samples"
	"github.com/quotaplane/quotaplane/pkg/policy"
)

const samplesDir = "../../config/samples"

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func symlink(t *testing.T, target, link string) {
	t.Helper()
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
}

func objectIDs(objs []runtime.Object) []string {
	var ids []string
	for _, o := range objs {
		m := o.(metav1.Object)
		ids = append(ids, o.GetObjectKind().GroupVersionKind().Kind+" "+m.GetNamespace()+"/"+m.GetName())
	}
	return ids
}

const planeYAML = `apiVersion: quotaplane.io/v1alpha1
kind: QuotaPlane
metadata:
  name: main
spec:
  global: {rate: 1000}
  tiers:
    - name: paid
      weight: 2
    - name: free
`

func tenantYAML(name, tier string) string {
	return "apiVersion: quotaplane.io/v1alpha1\nkind: TenantQuota\nmetadata:\n  name: " + name +
		"\nspec:\n  tenant: " + name + "\n  tier: " + tier + "\n"
}

func TestSamplesLoad(t *testing.T) {
	p, err := policy.LoadDir(samplesDir)
	if err != nil {
		t.Fatalf("LoadDir(%s): %v", samplesDir, err)
	}
	// The counts config/samples declares: one plane (main) with three tiers,
	// three endpoints, six tenants and a burst pool.
	s := p.Spec()
	if s.Plane != "main" || s.Namespace != policy.DefaultNamespace {
		t.Errorf("plane = %s/%s, want default/main", s.Namespace, s.Plane)
	}
	if got, want := tierOrder(p), []string{"enterprise", "standard", "free"}; !slices.Equal(got, want) {
		t.Errorf("tiers = %v, want %v", got, want)
	}
	if got, want := endpointNames(p), []string{"export", "read", "write"}; !slices.Equal(got, want) {
		t.Errorf("endpoints = %v, want %v", got, want)
	}
	if got, want := tenantNames(p), []string{"acme", "free-trial", "globex", "initech", "whale-1", "whale-2"}; !slices.Equal(got, want) {
		t.Errorf("tenants = %v, want %v", got, want)
	}
	if s.BurstPool == nil || s.BurstPool.Size != 5000 || !slices.Equal(s.BurstPool.Tiers, []string{"enterprise", "standard"}) {
		t.Errorf("burst pool = %+v", s.BurstPool)
	}
	if s.DefaultTier != "free" || s.Global != *tb(10000, 20000, time.Second) || s.Enforcer.MaxReplicas != 40 {
		t.Errorf("default tier %q, global %+v, enforcer %+v", s.DefaultTier, s.Global, s.Enforcer)
	}
	// The sliding window the samples use for free exports: 2 exports (cost 50) in any 5 minutes.
	export := p.Endpoints()[0]
	free := mustDefaultTenant(t, p, "someone", "")
	want := &policy.Limit{Rate: 100, Burst: 100, Period: 5 * time.Minute, Algorithm: policy.SlidingWindow}
	if got := p.EndpointLimit(free, 0); export.Cost != 50 || got == nil || *got != *want {
		t.Errorf("export for a free tenant = cost %d, %v; want cost 50, %v", export.Cost, got, want)
	}
	if acme := mustTenant(t, p, "acme"); p.KeyLimit(acme, "acme-partner").Rate != 10 || p.KeyLimit(acme, "other").Rate != 200 {
		t.Errorf("acme key limits = %v / %v", p.KeyLimit(acme, "acme-partner"), p.KeyLimit(acme, "other"))
	}
	if whale := mustTenant(t, p, "whale-1"); whale.Weight != 10 || whale.Limit.Rate != 3000 || !p.MayBorrow(whale) {
		t.Errorf("whale-1 = %+v", whale)
	}
	if globex := mustTenant(t, p, "globex"); !globex.Hard || p.MayBorrow(globex) {
		t.Errorf("globex = %+v, want hard and not borrowing", globex)
	}

	objs, err := policy.ReadDir(samplesDir)
	if err != nil {
		t.Fatal(err)
	}
	if len(objs) != 11 {
		t.Errorf("ReadDir found %d objects, want 11:\n%v", len(objs), objectIDs(objs))
	}
}

func TestDecodeYAMLMultiDocumentFile(t *testing.T) {
	data, err := os.ReadFile("testdata/multidoc.yaml")
	if err != nil {
		t.Fatal(err)
	}
	objs, err := policy.DecodeYAML(data)
	if err != nil {
		t.Fatalf("DecodeYAML: %v", err)
	}
	want := []string{"QuotaPlane default/edge", "EndpointQuota default/search", "TenantQuota default/acme"}
	if got := objectIDs(objs); !slices.Equal(got, want) {
		t.Fatalf("objects = %v, want %v (comments, empty documents, the kustomization and the ConfigMap skipped)", got, want)
	}
	p := mustCompile(t, objs...)
	acme := mustTenant(t, p, "acme")
	if got := p.KeyLimit(acme, "ci"); got == nil || *got != *tb(1, 2, 1500*time.Microsecond) {
		t.Errorf("acme key ci = %v, want 1 per 1.5ms (burst 2)", got)
	}
	if paid, _ := p.Tier("paid"); paid.Tenant == nil || *paid.Tenant != *tb(100, 300, 2*time.Second) {
		t.Errorf("tier paid = %+v", paid)
	}
	if p.Spec().DefaultTier != "free" {
		t.Errorf("default tier = %q, want free", p.Spec().DefaultTier)
	}
}

func TestDecodeYAMLAccepts(t *testing.T) {
	const tq = "apiVersion: quotaplane.io/v1alpha1\nkind: TenantQuota\nmetadata:\n  name: t\n"
	tests := []struct {
		name string
		data string
		want []string
	}{
		{"empty input", "", nil},
		{"only whitespace", "\n  \n\t\n", nil},
		{"only comments", "# nothing here\n# at all\n", nil},
		{"only separators", "---\n---\n--- # trailing comment\n", nil},
		{"a null document", "---\nnull\n---\n~\n", nil},
		{"a kustomization", "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: [a.yaml]\n", nil},
		{"a document of another group with unknown fields", "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec: {replicas: 1, whatever: true}\n", nil},
		{"no namespace gets default", tq + "spec: {tenant: t}\n", []string{"TenantQuota default/t"}},
		{"an explicit namespace is kept", tq + "  namespace: team-a\nspec: {tenant: t}\n", []string{"TenantQuota team-a/t"}},
		{"a JSON document", `{"apiVersion":"quotaplane.io/v1alpha1","kind":"BurstPool","metadata":{"name":"p"},"spec":{"size":10,"refillRate":1,"perTenantCeiling":5}}`, []string{"BurstPool default/p"}},
		{"every kind", "apiVersion: quotaplane.io/v1alpha1\nkind: QuotaPlane\nmetadata: {name: a}\nspec: {global: {rate: 1}, tiers: [{name: x}]}\n---\n" +
			"apiVersion: quotaplane.io/v1alpha1\nkind: EndpointQuota\nmetadata: {name: b}\nspec: {endpoint: b}\n---\n" +
			"apiVersion: quotaplane.io/v1alpha1\nkind: BurstPool\nmetadata: {name: c}\nspec: {size: 1, refillRate: 0, perTenantCeiling: 1}\n---\n" +
			tq + "spec: {tenant: d}\n",
			[]string{"QuotaPlane default/a", "EndpointQuota default/b", "BurstPool default/c", "TenantQuota default/t"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			objs, err := policy.DecodeYAML([]byte(tt.data))
			if err != nil {
				t.Fatalf("DecodeYAML: %v", err)
			}
			if got := objectIDs(objs); !slices.Equal(got, tt.want) {
				t.Errorf("objects = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestDecodeYAMLRejects(t *testing.T) {
	const head = "apiVersion: quotaplane.io/v1alpha1\nkind: TenantQuota\nmetadata:\n  name: t\n"
	const good = head + "spec: {tenant: t}\n"
	misspelt, err := os.ReadFile("testdata/misspelt.yaml")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		data string
		want []string
	}{
		{"no apiVersion", "kind: TenantQuota\nmetadata: {name: t}\nspec: {tenant: t}\n",
			[]string{"document 1 has no apiVersion or kind", "start with apiVersion: quotaplane.io/v1alpha1"}},
		{"no kind in the second document", good + "---\napiVersion: quotaplane.io/v1alpha1\nmetadata: {name: u}\n",
			[]string{"document 2 has no apiVersion or kind"}},
		{"an empty mapping", "{}\n", []string{"document 1 has no apiVersion or kind"}},
		{"a misspelt field names its document", string(misspelt),
			[]string{"document 3 (EndpointQuota)", `unknown field "burts"`}},
		{"an unknown top-level field", head + "spec: {tenant: t}\nspecs: {}\n", []string{"document 1 (TenantQuota)", `unknown field "specs"`}},
		{"an unserved version", strings.Replace(good, "v1alpha1", "v1beta1", 1),
			[]string{`document 1: apiVersion "quotaplane.io/v1beta1" is not served; use quotaplane.io/v1alpha1`}},
		{"an unknown kind of the group", strings.Replace(good, "TenantQuota", "RatePlan", 1),
			[]string{`document 1: kind "RatePlan" is not a quotaplane.io kind`, "use QuotaPlane, TenantQuota, EndpointQuota, BurstPool or Upstream"}},
		{"no name", "apiVersion: quotaplane.io/v1alpha1\nkind: TenantQuota\nmetadata: {namespace: a}\nspec: {tenant: t}\n",
			[]string{"document 1 (TenantQuota): metadata.name is required"}},
		{"a syntax error in the second document", good + "---\napiVersion: [\n", []string{"document 2"}},
		{"a list", "- a\n- b\n", []string{"document 1"}},
		{"a duplicate field", head + "spec:\n  tenant: t\n  tenant: u\n", []string{"document 1 (TenantQuota)", `"tenant" already set`}},
		{"a wrong type", head + "spec: {tenant: t, weight: heavy}\n", []string{"document 1 (TenantQuota)"}},
		{"a bad duration", head + "spec: {tenant: t, limit: {rate: 1, period: 1 fortnight}}\n", []string{"document 1 (TenantQuota)", "fortnight"}},
		{"text after a separator", good + "--- not a comment\n" + good, []string{"invalid Yaml document separator: not a comment"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			objs, err := policy.DecodeYAML([]byte(tt.data))
			if err == nil {
				t.Fatalf("DecodeYAML accepted it: %v", objectIDs(objs))
			}
			if objs != nil {
				t.Errorf("DecodeYAML returned objects with an error: %v", objectIDs(objs))
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

func TestLoadDirConfigMapMount(t *testing.T) {
	// The layout kubelet gives a mounted ConfigMap: the real files in a
	// timestamped directory, ..data pointing at it, and top-level links.
	dir := t.TempDir()
	const ts = "..2026_01_01_00_00_00.000000001"
	writeFile(t, filepath.Join(dir, ts, "plane.yaml"), planeYAML)
	writeFile(t, filepath.Join(dir, ts, "tenants.yaml"), tenantYAML("acme", "paid")+"---\n"+tenantYAML("initech", "free"))
	// A stale generation that is no longer linked must not be read.
	writeFile(t, filepath.Join(dir, "..2025_12_31_00_00_00.000000001", "plane.yaml"), "not: [valid")
	symlink(t, ts, filepath.Join(dir, "..data"))
	symlink(t, "..data/plane.yaml", filepath.Join(dir, "plane.yaml"))
	symlink(t, "..data/tenants.yaml", filepath.Join(dir, "tenants.yaml"))

	p, err := policy.LoadDir(dir)
	if err != nil {
		t.Fatalf("LoadDir: %v", err)
	}
	if got, want := tenantNames(p), []string{"acme", "initech"}; !slices.Equal(got, want) || p.Plane() != "main" {
		t.Errorf("plane %q tenants %v, want main %v", p.Plane(), got, want)
	}
	objs, err := policy.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(objs) != 3 {
		t.Errorf("ReadDir read %d objects, want 3 (each file once): %v", len(objs), objectIDs(objs))
	}
}

func TestLoadDirSkipsWhatIsNotAPolicyFile(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "plane.yaml"), planeYAML)
	writeFile(t, filepath.Join(dir, "tenant.yml"), tenantYAML("yml", "paid"))
	writeFile(t, filepath.Join(dir, "tenant.json"), `{"apiVersion":"quotaplane.io/v1alpha1","kind":"TenantQuota","metadata":{"name":"json"},"spec":{"tenant":"json"}}`)
	const broken = "apiVersion: quotaplane.io/v1alpha1\nkind: TenantQuota\nmetadata: {name: broken}\nspec: {tenant: broken, tier: nope, burts: 1}\n"
	writeFile(t, filepath.Join(dir, ".hidden.yaml"), broken)
	writeFile(t, filepath.Join(dir, "README.md"), broken)
	writeFile(t, filepath.Join(dir, "tenant.yaml.bak"), broken)
	writeFile(t, filepath.Join(dir, "YAML"), broken)
	writeFile(t, filepath.Join(dir, "nested.yaml", "inner.yaml"), broken) // a directory, not read
	writeFile(t, filepath.Join(dir, "sub", "tenant.yaml"), broken)        // subdirectories are not read
	symlink(t, "..data/gone.yaml", filepath.Join(dir, "gone.yaml"))       // dangling mid-swap

	p, err := policy.LoadDir(dir)
	if err != nil {
		t.Fatalf("LoadDir: %v", err)
	}
	if got, want := tenantNames(p), []string{"json", "yml"}; !slices.Equal(got, want) {
		t.Errorf("tenants = %v, want %v", got, want)
	}
}

func TestReadDirReadsFilesInNameOrder(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "b.yaml"), tenantYAML("b", "paid"))
	writeFile(t, filepath.Join(dir, "a.yaml"), tenantYAML("a2", "paid")+"---\n"+tenantYAML("a1", "paid"))
	writeFile(t, filepath.Join(dir, "c.json"), `{"apiVersion":"quotaplane.io/v1alpha1","kind":"TenantQuota","metadata":{"name":"c","namespace":"x"},"spec":{"tenant":"c"}}`)
	objs, err := policy.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"TenantQuota default/a2", "TenantQuota default/a1", "TenantQuota default/b", "TenantQuota x/c"}
	if got := objectIDs(objs); !slices.Equal(got, want) {
		t.Errorf("objects = %v, want %v", got, want)
	}
}

func TestLoadDirErrors(t *testing.T) {
	tests := []struct {
		name  string
		files map[string]string
		want  []string
	}{
		{
			name:  "a bad object",
			files: map[string]string{"plane.yaml": planeYAML, "t.yaml": tenantYAML("good", "paid") + "---\n" + tenantYAML("bad", "platinum")},
			want: []string{
				": 1 problem(s):\n",
				`TenantQuota default/bad: spec.tier: tier "platinum" is not one of the plane's tiers; use one of free, paid`,
			},
		},
		{
			name: "every problem is listed",
			files: map[string]string{
				"plane.yaml": planeYAML,
				"t.yaml":     tenantYAML("bad", "platinum"),
				"e.yaml":     "apiVersion: quotaplane.io/v1alpha1\nkind: EndpointQuota\nmetadata: {name: e, namespace: other}\nspec: {endpoint: e}\n",
			},
			want: []string{": 2 problem(s):\n", "EndpointQuota other/e: metadata.namespace:", "TenantQuota default/bad: spec.tier:"},
		},
		{
			name:  "no QuotaPlane",
			files: map[string]string{"t.yaml": tenantYAML("a", "paid")},
			want:  []string{"1 problem(s)", "the plane has no QuotaPlane"},
		},
		{
			name:  "an empty directory",
			files: map[string]string{},
			want:  []string{"QuotaPlane: the plane has no QuotaPlane"},
		},
		{
			name: "files that do not decode are all named",
			files: map[string]string{
				"plane.yaml": planeYAML,
				"a.yaml":     "kind: TenantQuota\n",
				"b.yaml":     tenantYAML("b", "paid") + "---\n" + strings.Replace(tenantYAML("c", "paid"), "tier:", "teir:", 1),
			},
			want: []string{"a.yaml: document 1 has no apiVersion or kind", "b.yaml: document 2 (TenantQuota)", `unknown field "teir"`},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			for name, content := range tt.files {
				writeFile(t, filepath.Join(dir, name), content)
			}
			p, err := policy.LoadDir(dir)
			if err == nil {
				t.Fatalf("LoadDir succeeded (hash %s)", p.Hash())
			}
			if p != nil {
				t.Error("LoadDir returned a policy with its error")
			}
			if !strings.HasPrefix(err.Error(), dir) {
				t.Errorf("error %q does not start with the directory", err)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

func TestLoadDirMissingDirectory(t *testing.T) {
	_, err := policy.LoadDir(filepath.Join(t.TempDir(), "missing"))
	if err == nil || !strings.Contains(err.Error(), "read policy directory") {
		t.Errorf("error = %v, want read policy directory", err)
	}
}

func TestLoadDirRejectsAnOversizedFile(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "plane.yaml"), planeYAML)
	big := make([]byte, 16<<20+1)
	for i := range big {
		big[i] = '#'
	}
	if err := os.WriteFile(filepath.Join(dir, "big.yaml"), big, 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := policy.LoadDir(dir)
	if err == nil || !strings.Contains(err.Error(), "big.yaml: larger than 16777216 bytes") {
		t.Errorf("error = %v, want big.yaml larger than 16777216 bytes", err)
	}
	// A file of exactly the limit is read.
	if err := os.WriteFile(filepath.Join(dir, "big.yaml"), big[:16<<20], 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := policy.LoadDir(dir); err != nil {
		t.Errorf("a file of exactly 16 MiB: %v", err)
	}
}

func TestDecodeYAMLFeedsCompile(t *testing.T) {
	// Objects from YAML compile to the same policy as the same objects built in Go.
	objs, err := policy.DecodeYAML([]byte(planeYAML + "---\n" + tenantYAML("acme", "paid")))
	if err != nil {
		t.Fatal(err)
	}
	fromYAML := mustCompile(t, objs...)
	qp := &v1alpha1.QuotaPlane{
		ObjectMeta: metav1.ObjectMeta{Namespace: policy.DefaultNamespace, Name: "main"},
		Spec: v1alpha1.QuotaPlaneSpec{
			Global: *lim(1000, 0),
			Tiers:  []v1alpha1.Tier{{Name: "paid", Weight: 2}, {Name: "free"}},
		},
	}
	tq := &v1alpha1.TenantQuota{
		ObjectMeta: metav1.ObjectMeta{Namespace: policy.DefaultNamespace, Name: "acme"},
		Spec:       v1alpha1.TenantQuotaSpec{Tenant: "acme", Tier: "paid"},
	}
	if fromGo := mustCompile(t, qp, tq); fromGo.Hash() != fromYAML.Hash() {
		t.Errorf("hash from YAML %s, from Go %s:\n%s\n%s", fromYAML.Hash(), fromGo.Hash(), fromYAML.EncodedSpec(), fromGo.EncodedSpec())
	}
}

func TestLoadFSOfTheEmbeddedSamplesMatchesLoadDir(t *testing.T) {
	fromDir, err := policy.LoadDir(samplesDir)
	if err != nil {
		t.Fatal(err)
	}
	fromFS, err := policy.LoadFS(samples.FS)
	if err != nil {
		t.Fatalf("LoadFS(samples.FS): %v", err)
	}
	if fromFS.Hash() != fromDir.Hash() {
		t.Errorf("embedded samples hash %s, directory %s", fromFS.Hash(), fromDir.Hash())
	}
}

func TestLoadFS(t *testing.T) {
	const broken = "apiVersion: quotaplane.io/v1alpha1\nkind: TenantQuota\nmetadata: {name: broken}\nspec: {burts: 1}\n"
	tests := []struct {
		name        string
		fsys        fstest.MapFS
		wantTenants []string
		wantErr     []string
	}{
		{
			name: "policy files only",
			fsys: fstest.MapFS{
				"plane.yaml":        {Data: []byte(planeYAML)},
				"t.yml":             {Data: []byte(tenantYAML("a", "paid"))},
				".hidden.yaml":      {Data: []byte(broken)},
				"notes.txt":         {Data: []byte(broken)},
				"dir.yaml/x.yaml":   {Data: []byte(broken)},
				"..data/plane.yaml": {Data: []byte(broken)},
			},
			wantTenants: []string{"a"},
		},
		{
			name:    "a bad object",
			fsys:    fstest.MapFS{"plane.yaml": {Data: []byte(planeYAML)}, "t.yaml": {Data: []byte(tenantYAML("a", "gold"))}},
			wantErr: []string{"1 problem(s):\n", `TenantQuota default/a: spec.tier: tier "gold" is not one of the plane's tiers`},
		},
		{
			name:    "a file that does not decode",
			fsys:    fstest.MapFS{"plane.yaml": {Data: []byte(planeYAML)}, "t.yaml": {Data: []byte(broken)}},
			wantErr: []string{"t.yaml: document 1 (TenantQuota)", `unknown field "burts"`},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := policy.LoadFS(tt.fsys)
			if tt.wantErr == nil {
				if err != nil {
					t.Fatalf("LoadFS: %v", err)
				}
				if got := tenantNames(p); !slices.Equal(got, tt.wantTenants) {
					t.Errorf("tenants = %v, want %v", got, tt.wantTenants)
				}
				return
			}
			if err == nil {
				t.Fatalf("LoadFS succeeded (hash %s)", p.Hash())
			}
			for _, w := range tt.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}
