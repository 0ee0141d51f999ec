package config_test

// The Helm chart (deploy/helm/quotaplane) is linted and rendered by the real
// Helm (QUOTAPLANE_HELM, built by hack/helm.sh; `make test` sets it), and
// what it renders is sent to the real test API server with server-side
// dry-run and strict field validation, prometheus-operator's CRDs
// (QUOTAPLANE_MONITORING_CRDS, hack/monitoring-crds.sh) installed first for
// the ServiceMonitors and the PrometheusRule. With its default values the
// chart must render what config/default renders, object for object (labels
// aside), so that the two installs cannot drift apart. Without the
// variables the tests skip, except under CI=true, where they fail.

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"

	"github.com/quotaplane/quotaplane/pkg/testenv"
)

// tool is the binary an environment variable names; it skips the test
// without one, and fails it under CI=true.
func tool(t *testing.T, env, how string) string {
	t.Helper()
	path := os.Getenv(env)
	if path == "" {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s is unset under CI=true: run this test through `make test`, which %s and sets %s", env, how, env)
		}
		t.Skipf("%s is unset: `make test` %s and sets it", env, how)
	}
	return path
}

func chartDir() string { return filepath.Join(testenv.Root(), "deploy", "helm", "quotaplane") }

// runHelm runs helm with its configuration, cache and data in a temporary
// directory, so that nothing of the user's Helm set-up takes part.
func runHelm(t *testing.T, helm string, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	home := t.TempDir()
	cmd := exec.Command(helm, args...)
	cmd.Env = append(os.Environ(),
		"HELM_CONFIG_HOME="+filepath.Join(home, "config"),
		"HELM_CACHE_HOME="+filepath.Join(home, "cache"),
		"HELM_DATA_HOME="+filepath.Join(home, "data"))
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err = cmd.Run()
	return out.String(), errOut.String(), err
}

// helmTemplate renders the chart into namespace with the values files.
func helmTemplate(t *testing.T, helm, namespace string, values ...string) []*unstructured.Unstructured {
	t.Helper()
	args := []string{"template", "quotaplane", chartDir(), "--namespace", namespace, "--include-crds"}
	for _, v := range values {
		args = append(args, "--values", filepath.Join(chartDir(), "ci", v))
	}
	out, errOut, err := runHelm(t, helm, args...)
	if err != nil {
		t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, errOut)
	}
	objs, err := decodeAll(strings.NewReader(out))
	if err != nil {
		t.Fatalf("decode the output of helm %s: %v", strings.Join(args, " "), err)
	}
	return objs
}

func TestHelmChart(t *testing.T) {
	helm := tool(t, "QUOTAPLANE_HELM", "builds Helm (hack/helm.sh)")
	monitoringCRDs := tool(t, "QUOTAPLANE_MONITORING_CRDS", "fetches prometheus-operator's CRDs (hack/monitoring-crds.sh)")
	kustomize := tool(t, "KUSTOMIZE", "installs kustomize")
	root := testenv.Root()
	namespace := defaultNamespace(t, root)

	for _, values := range [][]string{nil, {"all-on-values.yaml"}, {"external-redis-values.yaml"}} {
		args := []string{"lint", "--strict", chartDir()}
		for _, v := range values {
			args = append(args, "--values", filepath.Join(chartDir(), "ci", v))
		}
		if out, errOut, err := runHelm(t, helm, args...); err != nil {
			t.Errorf("helm %s: %v\n%s%s", strings.Join(args, " "), err, out, errOut)
		}
	}

	defaults := helmTemplate(t, helm, namespace)
	allOn := helmTemplate(t, helm, "quota", "all-on-values.yaml")
	external := helmTemplate(t, helm, namespace, "external-redis-values.yaml")

	t.Run("defaults are config/default", func(t *testing.T) {
		m := index(t, defaults)
		checkSameObjects(t, index(t, kustomizeBuild(t, kustomize, filepath.Join(root, "config", "default"))), m)
		checkCRDsAreTheBases(t, root, m)
		enforcer := deployment(t, m, namespace, enforcerName)
		checkPlane(t, root, namespace, enforcer)
		checkNetworkPolicy(t, m, namespace, enforcer)
		checkEnforcerSpread(t, m, enforcer)
		for _, kind := range []string{"ServiceMonitor", "PrometheusRule"} {
			if len(m.ofKind(kind)) > 0 {
				t.Errorf("the chart's defaults render a %s: monitoring is off by default (it needs prometheus-operator's CRDs)", kind)
			}
		}
	})

	t.Run("all on", func(t *testing.T) {
		m := index(t, allOn)
		checkCRDsAreTheBases(t, root, m)
		checkLeaderElect(t, deployment(t, m, "quota", managerName))
		checkRedisPolicy(t, m, "quota")
		checkServices(t, m)
		checkRBAC(t, m, "quota")
		manager := deployment(t, m, "quota", managerName)
		if *manager.Spec.Replicas != 2 {
			t.Errorf("manager.replicas 2 renders %d replicas", *manager.Spec.Replicas)
		}
		checkGoMemLimit(t, manager, 1<<30/10*9)
		enforcer := deployment(t, m, "quota", enforcerName)
		if got := envValue(t, enforcer, "QUOTAPLANE_PLANE"); got != "quota/edge" {
			t.Errorf("enforcer.plane edge in namespace quota: QUOTAPLANE_PLANE is %q, want quota/edge", got)
		}
		if c := container(t, enforcer); c.Image != "registry.example.com/quotaplane/enforcer:v0.1.0" {
			t.Errorf("enforcer image %q, want the values' registry.example.com/quotaplane/enforcer:v0.1.0", c.Image)
		}
		if enforcer.Spec.Replicas != nil {
			t.Errorf("the enforcer Deployment sets replicas %d: the manager owns them, an upgrade would reset them", *enforcer.Spec.Replicas)
		}
		for _, u := range m.ofKind("Deployment") {
			var d appsv1.Deployment
			convert(t, u, &d)
			checkHardened(t, &d)
			if d.Name == "quotaplane-redis" { // the trial Redis reads the Secret's files (trust_test.go)
				if !slices.ContainsFunc(d.Spec.Template.Spec.Volumes, func(v corev1.Volume) bool {
					return v.Secret != nil && v.Secret.SecretName == "redis-auth" && slices.Contains(v.Secret.Items, corev1.KeyToPath{Key: "secret", Path: "password"})
				}) {
					t.Errorf("the trial Redis does not mount redis.passwordSecret redis-auth/secret as its file password: %+v", d.Spec.Template.Spec.Volumes)
				}
				continue
			}
			pw := envFrom(t, &d, "QUOTAPLANE_REDIS_PASSWORD")
			if pw == nil || pw.SecretKeyRef == nil || pw.SecretKeyRef.Name != "redis-auth" || pw.SecretKeyRef.Key != "secret" {
				t.Errorf("Deployment %s: the Redis password is not read from redis.passwordSecret redis-auth/secret: %+v", d.Name, pw)
			}
		}
		checkEnforcerSpread(t, m, enforcer)
		checkPrometheusRule(t, root, m, "quota")
		if got := len(m.ofKind("ServiceMonitor")); got != 2 {
			t.Errorf("monitoring.serviceMonitor.enabled renders %d ServiceMonitors, want 2 (manager, enforcers)", got)
		}
	})

	t.Run("external Redis", func(t *testing.T) {
		m := index(t, external)
		for _, kind := range []string{"PodDisruptionBudget", "ValidatingAdmissionPolicy"} {
			if len(m.ofKind(kind)) > 0 {
				t.Errorf("turned off, a %s is still rendered", kind)
			}
		}
		if _, ok := m.get("Deployment", namespace, "quotaplane-redis"); ok {
			t.Error("redis.trial.enabled=false still renders the trial Redis")
		}
		if _, ok := m.get("ClusterRole", "", "quotaplane-view"); ok {
			t.Error("aggregatedRoles.enabled=false still renders ClusterRole quotaplane-view")
		}
		enforcer := deployment(t, m, namespace, enforcerName)
		if got := envValue(t, enforcer, "QUOTAPLANE_REDIS_ADDR"); got != "redis.example.com:6380" {
			t.Errorf("redis.address redis.example.com:6380: the enforcers' QUOTAPLANE_REDIS_ADDR is %q", got)
		}
		if c := container(t, deployment(t, m, namespace, managerName)); !slices.Contains(c.Args, "--redis-addr=redis.example.com:6380") {
			t.Errorf("redis.address redis.example.com:6380: the manager's args are %q", c.Args)
		}
		if enforcer.Spec.Template.Spec.Affinity != nil {
			t.Errorf("enforcer.antiAffinity.enabled=false still sets %+v", enforcer.Spec.Template.Spec.Affinity)
		}
		checkServices(t, m)
		checkRBAC(t, m, namespace)
	})

	t.Run("bad values", func(t *testing.T) {
		for _, c := range []struct {
			set  []string
			want string
		}{
			{[]string{"redis.trial.enabled=false"}, "set redis.address"},
			{[]string{"manager.resources.limits.memory=lots"}, `memory limit "lots"`},
			{[]string{"manager.resources.limits.memory=1.5Gi"}, `memory limit "1.5Gi"`},
			{[]string{"enforcer.resources.limits.memory=null"}, "enforcer.resources.limits.memory is required"},
			{[]string{"enforcer.plane="}, "enforcer.plane is required"},
			// values.schema.json: a misspelt value is an error, not ignored
			{[]string{"manager.replica=2"}, "additional properties 'replica' not allowed"},
			{[]string{"redis.address=redis.example.com"}, "/redis/address"},
			{[]string{"enforcer.antiAffinity.weight=500"}, "/enforcer/antiAffinity/weight"},
		} {
			args := []string{"template", "quotaplane", chartDir(), "--namespace", namespace}
			for _, s := range c.set {
				args = append(args, "--set", s)
			}
			_, errOut, err := runHelm(t, helm, args...)
			if err == nil || !strings.Contains(errOut, c.want) {
				t.Errorf("helm template --set %s: err %v, stderr %q; want an error saying %q", strings.Join(c.set, ","), err, errOut, c.want)
			}
		}
		// Plain bytes and decimal suffixes are quantities too.
		for memory, want := range map[string]int64{"268435456": 268435456 / 10 * 9, "500M": 500_000_000 / 10 * 9} {
			objs, errOut, err := runHelm(t, helm, "template", "quotaplane", chartDir(), "--namespace", namespace, "--set-string", "manager.resources.limits.memory="+memory)
			if err != nil {
				t.Fatalf("memory limit %s: %v\n%s", memory, err, errOut)
			}
			decoded, err := decodeAll(strings.NewReader(objs))
			if err != nil {
				t.Fatal(err)
			}
			checkGoMemLimit(t, deployment(t, index(t, decoded), namespace, managerName), want)
		}
	})

	// What the API server makes of it: CRDs first (testenv installs
	// config/crd/bases, which the chart's crds/ are copies of; then
	// prometheus-operator's), then every other object of every render,
	// created with server-side dry-run and strict field validation.
	env := testenv.Start(t)
	if _, err := envtest.InstallCRDs(env.Config, envtest.CRDInstallOptions{
		Paths: []string{
			filepath.Join(monitoringCRDs, "monitoring.coreos.com_servicemonitors.yaml"),
			filepath.Join(monitoringCRDs, "monitoring.coreos.com_prometheusrules.yaml"),
		},
		ErrorIfPathMissing: true,
	}); err != nil {
		t.Fatalf("install prometheus-operator's CRDs from %s: %v", monitoringCRDs, err)
	}
	ctx := t.Context()
	for _, ns := range []string{namespace, "quota"} {
		if err := env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			t.Fatal(err)
		}
	}
	var sent, accepted int
	for _, u := range slices.Concat(defaults, allOn, external) {
		if u.GetKind() == "CustomResourceDefinition" {
			continue
		}
		sent++
		if err := env.Client.Create(ctx, u.DeepCopy(), client.DryRunAll, client.FieldValidation(metav1.FieldValidationStrict)); err != nil {
			t.Errorf("%s: the API server rejected it: %v", describe(u), err)
			continue
		}
		accepted++
	}
	t.Logf("the API server accepted %d of the %d objects the three renders hold besides their CRDs (server-side dry run)", accepted, sent)

	t.Run("install, upgrade, uninstall", func(t *testing.T) {
		helmLifecycle(t, env, helm, namespace)
	})
}

// helmLifecycle installs the chart with Helm itself on the test API server,
// lets the enforcer Deployment be scaled as the manager scales it, upgrades
// to every option on, and uninstalls: the upgrade must keep the manager's
// replica count, and the uninstall must keep the CRDs (and so the quota
// objects).
func helmLifecycle(t *testing.T, env *testenv.Env, helm, namespace string) {
	user, err := env.AddUser(envtest.User{Name: "helm", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig, err := user.KubeConfig()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(path, kubeconfig, 0o600); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) {
		t.Helper()
		args = append(args, "--kubeconfig", path, "--namespace", namespace)
		if out, errOut, err := runHelm(t, helm, args...); err != nil {
			t.Fatalf("helm %s: %v\n%s%s", strings.Join(args, " "), err, out, errOut)
		}
	}
	ctx := t.Context()
	run("install", "quotaplane", chartDir())
	var enforcer appsv1.Deployment
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: enforcerName}, &enforcer); err != nil {
		t.Fatalf("after helm install: %v", err)
	}
	// What the manager does: scale the fleet through the scale subresource.
	scale := &autoscalingv1.Scale{Spec: autoscalingv1.ScaleSpec{Replicas: 5}}
	if err := env.Client.SubResource("scale").Update(ctx, &enforcer, client.WithSubResourceBody(scale)); err != nil {
		t.Fatalf("scale the enforcers as the manager does: %v", err)
	}
	run("upgrade", "quotaplane", chartDir(), "--values", filepath.Join(chartDir(), "ci", "all-on-values.yaml"))
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(&enforcer), &enforcer); err != nil {
		t.Fatal(err)
	}
	if *enforcer.Spec.Replicas != 5 {
		t.Errorf("helm upgrade set the enforcers' replicas to %d; the manager had set 5", *enforcer.Spec.Replicas)
	}
	if enforcer.Spec.Template.Spec.Containers[0].Image != "registry.example.com/quotaplane/enforcer:v0.1.0" {
		t.Errorf("helm upgrade did not apply the new values: image %s", enforcer.Spec.Template.Spec.Containers[0].Image)
	}
	var monitors unstructured.UnstructuredList
	monitors.SetAPIVersion("monitoring.coreos.com/v1")
	monitors.SetKind("ServiceMonitorList")
	if err := env.Client.List(ctx, &monitors, client.InNamespace(namespace)); err != nil || len(monitors.Items) != 2 {
		t.Errorf("after the upgrade with monitoring on: %d ServiceMonitors (%v), want 2", len(monitors.Items), err)
	}
	run("uninstall", "quotaplane")
	err = env.Client.Get(ctx, client.ObjectKeyFromObject(&enforcer), &enforcer)
	if !apierrors.IsNotFound(err) {
		t.Errorf("after helm uninstall the enforcer Deployment is still there (%v)", err)
	}
	var crd unstructured.Unstructured
	crd.SetAPIVersion("apiextensions.k8s.io/v1")
	crd.SetKind("CustomResourceDefinition")
	if err := env.Client.Get(ctx, client.ObjectKey{Name: "tenantquotas.quotaplane.io"}, &crd); err != nil {
		t.Errorf("helm uninstall took the CRDs, and every quota object with them: %v", err)
	}
}

// checkSameObjects: the chart renders every object kustomize does but the
// Namespace (Helm's --create-namespace makes it), with the same content
// but labels and annotations, and nothing more.
func checkSameObjects(t *testing.T, want, got manifests) {
	t.Helper()
	strip := func(u *unstructured.Unstructured) map[string]any {
		c := u.DeepCopy()
		c.SetLabels(nil)
		c.SetAnnotations(nil)
		return c.Object
	}
	for k, w := range want {
		if w.GetKind() == "Namespace" {
			continue
		}
		g, ok := got[k]
		if !ok {
			t.Errorf("config/default renders %s, the chart does not", describe(w))
			continue
		}
		if !reflect.DeepEqual(strip(w), strip(g)) {
			wy, _ := yaml.Marshal(strip(w))
			gy, _ := yaml.Marshal(strip(g))
			t.Errorf("%s differs between config/default and the chart's defaults:\nconfig/default:\n%s\nchart:\n%s", describe(w), wy, gy)
		}
	}
	for k, g := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("the chart's defaults render %s, config/default does not", describe(g))
		}
	}
}

func envFrom(t *testing.T, d *appsv1.Deployment, names ...string) *corev1.EnvVarSource {
	t.Helper()
	for _, e := range container(t, d).Env {
		if slices.Contains(names, e.Name) {
			return e.ValueFrom
		}
	}
	return nil
}

func envValue(t *testing.T, d *appsv1.Deployment, name string) string {
	t.Helper()
	for _, e := range container(t, d).Env {
		if e.Name == name {
			return e.Value
		}
	}
	return ""
}

// checkGoMemLimit: GOMEMLIMIT is 90% of the container's memory limit, the
// share the enforcer keeps itself (cmd/enforcer's -memory-limit).
func checkGoMemLimit(t *testing.T, d *appsv1.Deployment, want int64) {
	t.Helper()
	limit := container(t, d).Resources.Limits.Memory()
	if limit.IsZero() {
		t.Fatalf("Deployment %s/%s sets no memory limit", d.Namespace, d.Name)
	}
	if got := limit.Value() / 10 * 9; got != want {
		t.Errorf("Deployment %s/%s: memory limit %s, 90%% of it is %d, the test expects %d", d.Namespace, d.Name, limit, got, want)
	}
	got, err := strconv.ParseInt(envValue(t, d, "GOMEMLIMIT"), 10, 64)
	if err != nil || got != want {
		t.Errorf("Deployment %s/%s: GOMEMLIMIT %q (%v), want %d, 90%% of its memory limit %s", d.Namespace, d.Name, envValue(t, d, "GOMEMLIMIT"), err, want, limit)
	}
}

// checkEnforcerSpread: a PodDisruptionBudget bounds how many enforcers a
// drain evicts at once, and the pods prefer (not require: a one-node
// cluster still runs them all) to run on different nodes.
func checkEnforcerSpread(t *testing.T, m manifests, enforcer *appsv1.Deployment) {
	t.Helper()
	pods := labels.Set(enforcer.Spec.Template.Labels)
	var budgets int
	for _, u := range m.ofKind("PodDisruptionBudget") {
		var pdb policyv1.PodDisruptionBudget
		convert(t, u, &pdb)
		sel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
		if err != nil || pdb.Namespace != enforcer.Namespace || !sel.Matches(pods) {
			continue
		}
		budgets++
		// minAvailable would block every drain of a one-replica fleet
		// (a local plane's).
		if pdb.Spec.MaxUnavailable == nil || pdb.Spec.MinAvailable != nil {
			t.Errorf("PodDisruptionBudget %s/%s: set maxUnavailable, not minAvailable: the manager resizes the fleet, down to one pod", pdb.Namespace, pdb.Name)
		}
		if pdb.Spec.UnhealthyPodEvictionPolicy == nil || *pdb.Spec.UnhealthyPodEvictionPolicy != policyv1.AlwaysAllow {
			t.Errorf("PodDisruptionBudget %s/%s: unready enforcers must stay evictable (unhealthyPodEvictionPolicy: AlwaysAllow)", pdb.Namespace, pdb.Name)
		}
	}
	if budgets != 1 {
		t.Errorf("%d PodDisruptionBudgets select the enforcer pods, want 1", budgets)
	}
	aff := enforcer.Spec.Template.Spec.Affinity
	if aff == nil || aff.PodAntiAffinity == nil || len(aff.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution) != 1 ||
		len(aff.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution) != 0 {
		t.Fatalf("Deployment %s/%s: want one preferred pod anti-affinity term and no required one, got %+v", enforcer.Namespace, enforcer.Name, aff)
	}
	term := aff.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution[0].PodAffinityTerm
	sel, err := metav1.LabelSelectorAsSelector(term.LabelSelector)
	if term.TopologyKey != corev1.LabelHostname || err != nil || !sel.Matches(pods) {
		t.Errorf("Deployment %s/%s: the anti-affinity term must keep its own pods (%v) apart by %s; got key %q, selector %v", enforcer.Namespace, enforcer.Name, pods, corev1.LabelHostname, term.TopologyKey, term.LabelSelector)
	}
}

// checkPrometheusRule: the PrometheusRule's groups are the rules file
// config/prometheus/quotaplane.rules.yaml.
func checkPrometheusRule(t *testing.T, root string, m manifests, namespace string) {
	t.Helper()
	rule, ok := m.get("PrometheusRule", namespace, "quotaplane")
	if !ok {
		t.Fatalf("monitoring.prometheusRule.enabled renders no PrometheusRule %s/quotaplane", namespace)
	}
	b, err := os.ReadFile(filepath.Join(root, "config", "prometheus", "quotaplane.rules.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var file map[string]any
	if err := yaml.Unmarshal(b, &file); err != nil {
		t.Fatalf("config/prometheus/quotaplane.rules.yaml: %v", err)
	}
	spec, _, _ := unstructured.NestedMap(rule.Object, "spec")
	if len(file["groups"].([]any)) == 0 || !reflect.DeepEqual(spec, file) {
		t.Errorf("the PrometheusRule's spec is not config/prometheus/quotaplane.rules.yaml:\n%v\nwant\n%v", spec, file)
	}
}

// TestHelmChartCopies: what the chart carries as copies (Helm reads only
// files inside the chart) is byte for byte the original. `make manifests`
// copies the generated ones; the rules file is copied by hand.
func TestHelmChartCopies(t *testing.T) {
	root := testenv.Root()
	copies := map[string]string{
		"files/quotaplane.rules.yaml": "config/prometheus/quotaplane.rules.yaml",
		"files/manager-role.yaml":     "config/rbac/role.yaml",
		"files/quota-roles.yaml":      "config/rbac/quota_roles.yaml",
		"files/tenant-tier.yaml":      "config/admission/tenant-tier.yaml",
	}
	bases, err := filepath.Glob(filepath.Join(root, "config", "crd", "bases", "*.yaml"))
	if err != nil || len(bases) == 0 {
		t.Fatalf("no CRDs in config/crd/bases (%v)", err)
	}
	for _, b := range bases {
		copies[filepath.Join("crds", filepath.Base(b))] = filepath.Join("config", "crd", "bases", filepath.Base(b))
	}
	inChart, _ := filepath.Glob(filepath.Join(chartDir(), "crds", "*"))
	if len(inChart) != len(bases) {
		t.Errorf("the chart's crds/ holds %d files, config/crd/bases %d: run make manifests", len(inChart), len(bases))
	}
	for copied, original := range copies {
		want, err := os.ReadFile(filepath.Join(root, original))
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(filepath.Join(chartDir(), copied))
		if err != nil {
			t.Errorf("the chart lacks %s, the copy of %s: %v", copied, original, err)
			continue
		}
		if !bytes.Equal(got, want) {
			t.Errorf("deploy/helm/quotaplane/%s differs from %s: copy it again (make manifests, or cp for the rules file)", copied, original)
		}
	}
}
