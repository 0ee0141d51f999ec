// Package config_test checks the shipped manifests: what
// `kustomize build config/default` renders is created, object by object,
// on a real API server (pkg/testenv), which must accept every one of them,
// and the rendered objects must agree with each other and with the samples.
//
// It needs kustomize: KUSTOMIZE names the binary (`make test` installs the
// pinned one into ./bin and sets it). Without KUSTOMIZE the test skips,
// except under CI=true, where it fails.
package config_test

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/quotaplane/quotaplane/pkg/policy"
	"github.com/quotaplane/quotaplane/pkg/testenv"
)

const (
	managerName  = "quotaplane-manager"
	enforcerName = "quotaplane-enforcer"
	adminPort    = 9090
	apiPort      = 8080
)

func TestDefaultInstallsOnARealAPIServer(t *testing.T) {
	kustomize := os.Getenv("KUSTOMIZE")
	if kustomize == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("KUSTOMIZE is unset under CI=true: run this test through `make test`, which installs kustomize and sets KUSTOMIZE")
		}
		t.Skip("KUSTOMIZE is unset: `make test` installs kustomize and sets it")
	}
	root := testenv.Root()
	objs := kustomizeBuild(t, kustomize, filepath.Join(root, "config", "default"))
	m := index(t, objs)

	namespace := defaultNamespace(t, root)
	if _, ok := m.get("Namespace", "", namespace); !ok {
		t.Errorf("config/default sets namespace %s but renders no Namespace %s: kubectl apply -k would fail on a fresh cluster", namespace, namespace)
	}
	checkCRDsAreTheBases(t, root, m)

	env := testenv.Start(t)
	ctx := t.Context()
	// Namespaces first, so that the order of the rest does not matter.
	sorted := slices.Clone(objs)
	slices.SortStableFunc(sorted, func(a, b *unstructured.Unstructured) int {
		return boolRank(a.GetKind() != "Namespace") - boolRank(b.GetKind() != "Namespace")
	})
	for _, u := range sorted {
		if u.GetKind() == "CustomResourceDefinition" {
			continue // testenv installed config/crd/bases already
		}
		// Strict: an unknown or misspelt field is an error, not a warning.
		if err := env.Client.Create(ctx, u.DeepCopy(), client.FieldValidation(metav1.FieldValidationStrict)); err != nil {
			t.Errorf("%s: the API server rejected it: %v", describe(u), err)
		}
	}

	enforcer := deployment(t, m, namespace, enforcerName)
	manager := deployment(t, m, namespace, managerName)
	checkPlane(t, root, namespace, enforcer)
	checkLeaderElect(t, manager)
	checkGoMemLimit(t, manager, 256<<20/10*9)
	checkEnforcerSpread(t, m, enforcer)
	checkNetworkPolicy(t, m, namespace, enforcer)
	checkRedisPolicy(t, m, namespace)
	checkServices(t, m)
	checkRBAC(t, m, namespace)
	for _, u := range m.ofKind("Deployment") {
		var d appsv1.Deployment
		convert(t, u, &d)
		checkHardened(t, &d)
	}
}

// kustomizeBuild runs `kustomize build dir` and decodes every object.
func kustomizeBuild(t *testing.T, kustomize, dir string) []*unstructured.Unstructured {
	t.Helper()
	var out, errOut bytes.Buffer
	cmd := exec.Command(kustomize, "build", dir)
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s build %s: %v\n%s", kustomize, dir, err, errOut.String())
	}
	objs, err := decodeAll(&out)
	if err != nil {
		t.Fatalf("decode the output of kustomize build %s: %v", dir, err)
	}
	if len(objs) == 0 {
		t.Fatalf("kustomize build %s rendered nothing", dir)
	}
	return objs
}

// decodeAll reads a stream of YAML documents; empty ones are skipped.
func decodeAll(r io.Reader) ([]*unstructured.Unstructured, error) {
	reader := utilyaml.NewYAMLReader(bufio.NewReader(r))
	var objs []*unstructured.Unstructured
	for {
		doc, err := reader.Read()
		if errors.Is(err, io.EOF) {
			return objs, nil
		}
		if err != nil {
			return nil, err
		}
		var fields map[string]any
		if err := yaml.Unmarshal(doc, &fields); err != nil {
			return nil, fmt.Errorf("%w in\n%s", err, doc)
		}
		if len(fields) == 0 {
			continue
		}
		u := &unstructured.Unstructured{Object: fields}
		if u.GetKind() == "" || u.GetName() == "" {
			return nil, fmt.Errorf("a document without kind or metadata.name:\n%s", doc)
		}
		objs = append(objs, u)
	}
}

// manifests indexes rendered objects by kind, namespace and name.
type manifests map[string]*unstructured.Unstructured

func key(kind, namespace, name string) string { return kind + "/" + namespace + "/" + name }

func index(t *testing.T, objs []*unstructured.Unstructured) manifests {
	t.Helper()
	m := manifests{}
	for _, u := range objs {
		k := key(u.GetKind(), u.GetNamespace(), u.GetName())
		if _, dup := m[k]; dup {
			t.Errorf("%s is rendered twice", describe(u))
		}
		m[k] = u
	}
	return m
}

func (m manifests) get(kind, namespace, name string) (*unstructured.Unstructured, bool) {
	u, ok := m[key(kind, namespace, name)]
	return u, ok
}

// ofKind returns the objects of a kind, sorted by key.
func (m manifests) ofKind(kind string) []*unstructured.Unstructured {
	var keys []string
	for k, u := range m {
		if u.GetKind() == kind {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	out := make([]*unstructured.Unstructured, len(keys))
	for i, k := range keys {
		out[i] = m[k]
	}
	return out
}

func describe(u *unstructured.Unstructured) string {
	if u.GetNamespace() == "" {
		return u.GetKind() + " " + u.GetName()
	}
	return u.GetKind() + " " + u.GetNamespace() + "/" + u.GetName()
}

func boolRank(b bool) int {
	if b {
		return 1
	}
	return 0
}

func convert(t *testing.T, u *unstructured.Unstructured, into any) {
	t.Helper()
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, into); err != nil {
		t.Fatalf("%s: %v", describe(u), err)
	}
}

// readYAML decodes the single object in a file.
func readYAML(t *testing.T, path string) *unstructured.Unstructured {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	objs, err := decodeAll(f)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if len(objs) != 1 {
		t.Fatalf("%s holds %d objects, want 1", path, len(objs))
	}
	return objs[0]
}

// defaultNamespace is the namespace config/default puts everything in.
func defaultNamespace(t *testing.T, root string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "config", "default", "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var k struct {
		Namespace string `json:"namespace"`
	}
	if err := yaml.Unmarshal(b, &k); err != nil {
		t.Fatalf("config/default/kustomization.yaml: %v", err)
	}
	if k.Namespace == "" {
		t.Fatal("config/default/kustomization.yaml sets no namespace")
	}
	return k.Namespace
}

// checkCRDsAreTheBases: config/default installs exactly the CRDs in
// config/crd/bases, the ones controller-gen writes and testenv installs.
func checkCRDsAreTheBases(t *testing.T, root string, m manifests) {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(root, "config", "crd", "bases", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no CRDs in config/crd/bases (%v)", err)
	}
	var want, got []string
	for _, f := range files {
		want = append(want, readYAML(t, f).GetName())
	}
	for _, u := range m.ofKind("CustomResourceDefinition") {
		got = append(got, u.GetName())
	}
	sort.Strings(want)
	sort.Strings(got)
	if !slices.Equal(got, want) {
		t.Errorf("config/default installs the CRDs %v, config/crd/bases holds %v: list every file of bases/ in config/crd/kustomization.yaml", got, want)
	}
}

func deployment(t *testing.T, m manifests, namespace, name string) *appsv1.Deployment {
	t.Helper()
	u, ok := m.get("Deployment", namespace, name)
	if !ok {
		t.Fatalf("config/default renders no Deployment %s/%s", namespace, name)
	}
	var d appsv1.Deployment
	convert(t, u, &d)
	return &d
}

func container(t *testing.T, d *appsv1.Deployment) *corev1.Container {
	t.Helper()
	if len(d.Spec.Template.Spec.Containers) != 1 {
		t.Fatalf("Deployment %s/%s has %d containers, want 1", d.Namespace, d.Name, len(d.Spec.Template.Spec.Containers))
	}
	return &d.Spec.Template.Spec.Containers[0]
}

// checkPlane: the enforcers follow the sample plane where config/default
// puts it, the plane `kubectl apply -n <namespace> -f config/samples/` makes.
func checkPlane(t *testing.T, root, namespace string, enforcer *appsv1.Deployment) {
	t.Helper()
	sample := readYAML(t, filepath.Join(root, "config", "samples", "quotaplane.yaml"))
	if sample.GetKind() != "QuotaPlane" {
		t.Fatalf("config/samples/quotaplane.yaml holds a %s, want a QuotaPlane", sample.GetKind())
	}
	want := namespace + "/" + sample.GetName()
	var got []string
	for _, e := range container(t, enforcer).Env {
		if e.Name == "QUOTAPLANE_PLANE" {
			got = append(got, e.Value)
		}
	}
	if len(got) != 1 || got[0] != want {
		t.Errorf("Deployment %s/%s sets QUOTAPLANE_PLANE to %q, want [%q] (config/default's namespace / the sample QuotaPlane's name)", enforcer.Namespace, enforcer.Name, got, want)
	}
	deploymentName, _, _ := unstructured.NestedString(sample.Object, "spec", "enforcer", "deploymentName")
	if deploymentName != enforcer.Name {
		t.Errorf("the sample QuotaPlane scales Deployment %q, config/default's enforcer is %q", deploymentName, enforcer.Name)
	}
}

func checkLeaderElect(t *testing.T, manager *appsv1.Deployment) {
	t.Helper()
	c := container(t, manager)
	if !slices.Contains(c.Args, "--leader-elect") && !slices.Contains(c.Args, "--leader-elect=true") {
		t.Errorf("Deployment %s/%s: args %q lack --leader-elect", manager.Namespace, manager.Name, c.Args)
	}
}

// checkNetworkPolicy: a policy selects the enforcer pods, leaves the
// decision API open and admits to the admin port only the manager's pods
// and namespaces labelled quotaplane.io/metrics: "true".
func checkNetworkPolicy(t *testing.T, m manifests, namespace string, enforcer *appsv1.Deployment) {
	t.Helper()
	podLabels := labels.Set(enforcer.Spec.Template.Labels)
	var found bool
	for _, u := range m.ofKind("NetworkPolicy") {
		var np networkingv1.NetworkPolicy
		convert(t, u, &np)
		sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
		if err != nil || np.Namespace != namespace || !sel.Matches(podLabels) {
			continue
		}
		found = true
		if !slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeIngress) {
			t.Errorf("NetworkPolicy %s/%s does not restrict ingress", np.Namespace, np.Name)
		}
		var apiOpen, adminCovered bool
		for _, rule := range np.Spec.Ingress {
			if ruleHasPort(rule, adminPort) {
				adminCovered = true
				checkAdminPeers(t, &np, rule.From)
			}
			if ruleHasPort(rule, apiPort) && len(rule.From) == 0 {
				apiOpen = true
			}
		}
		if !adminCovered {
			t.Errorf("NetworkPolicy %s/%s has no ingress rule for the admin port %d", np.Namespace, np.Name, adminPort)
		}
		if !apiOpen {
			t.Errorf("NetworkPolicy %s/%s does not leave the decision API (port %d) open to every client", np.Namespace, np.Name, apiPort)
		}
	}
	if !found {
		t.Errorf("no NetworkPolicy in %s selects the enforcer pods (labels %v)", namespace, podLabels)
	}
}

// checkRedisPolicy: when config/default renders the trial Redis, a
// NetworkPolicy selects its pods and admits to it only the manager's and
// the enforcers' pods.
func checkRedisPolicy(t *testing.T, m manifests, namespace string) {
	t.Helper()
	redis, ok := m.get("Deployment", namespace, "quotaplane-redis")
	if !ok {
		return
	}
	var d appsv1.Deployment
	convert(t, redis, &d)
	want := []networkingv1.NetworkPolicyPeer{
		{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app.kubernetes.io/name": managerName}}},
		{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app.kubernetes.io/name": enforcerName}}},
	}
	for _, u := range m.ofKind("NetworkPolicy") {
		var np networkingv1.NetworkPolicy
		convert(t, u, &np)
		sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
		if err != nil || np.Namespace != namespace || !sel.Matches(labels.Set(d.Spec.Template.Labels)) {
			continue
		}
		if len(np.Spec.Ingress) != 1 || !slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeIngress) {
			t.Fatalf("NetworkPolicy %s/%s: want one ingress rule, for Redis's port", np.Namespace, np.Name)
		}
		got, _ := yaml.Marshal(np.Spec.Ingress[0].From)
		exp, _ := yaml.Marshal(want)
		if !bytes.Equal(got, exp) {
			t.Errorf("NetworkPolicy %s/%s admits to Redis:\n%s\nwant only the manager's and the enforcers' pods:\n%s", np.Namespace, np.Name, got, exp)
		}
		return
	}
	t.Errorf("no NetworkPolicy in %s selects the trial Redis's pods: anything in the cluster may reach it", namespace)
}

// ruleHasPort reports whether rule admits traffic to port; a rule without
// ports admits it to every port.
func ruleHasPort(rule networkingv1.NetworkPolicyIngressRule, port int) bool {
	if len(rule.Ports) == 0 {
		return true
	}
	for _, p := range rule.Ports {
		if p.Port != nil && p.Port.IntValue() == port {
			return true
		}
	}
	return false
}

func checkAdminPeers(t *testing.T, np *networkingv1.NetworkPolicy, peers []networkingv1.NetworkPolicyPeer) {
	t.Helper()
	want := []networkingv1.NetworkPolicyPeer{
		{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app.kubernetes.io/name": managerName}}},
		{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"quotaplane.io/metrics": "true"}}},
	}
	got, _ := yaml.Marshal(peers)
	exp, _ := yaml.Marshal(want)
	if !bytes.Equal(got, exp) {
		t.Errorf("NetworkPolicy %s/%s admits to port %d:\n%s\nwant only the manager's pods and namespaces labelled quotaplane.io/metrics: \"true\":\n%s", np.Namespace, np.Name, adminPort, got, exp)
	}
}

// checkServices: every Service selects the pods of a rendered Deployment,
// and each target port is a port those pods declare.
func checkServices(t *testing.T, m manifests) {
	t.Helper()
	for _, u := range m.ofKind("Service") {
		var svc corev1.Service
		convert(t, u, &svc)
		var pods *corev1.PodTemplateSpec
		for _, du := range m.ofKind("Deployment") {
			var d appsv1.Deployment
			convert(t, du, &d)
			if d.Namespace == svc.Namespace && len(svc.Spec.Selector) > 0 &&
				labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(d.Spec.Template.Labels)) {
				pods = &d.Spec.Template
			}
		}
		if pods == nil {
			t.Errorf("Service %s/%s selects %v, the pods of no Deployment", svc.Namespace, svc.Name, svc.Spec.Selector)
			continue
		}
		for _, p := range svc.Spec.Ports {
			if !declaresPort(pods, p.TargetPort.String()) {
				t.Errorf("Service %s/%s: port %s targets %s, which its pods do not declare", svc.Namespace, svc.Name, p.Name, p.TargetPort.String())
			}
		}
	}
}

func declaresPort(pods *corev1.PodTemplateSpec, target string) bool {
	for _, c := range pods.Spec.Containers {
		for _, p := range c.Ports {
			if p.Name == target || fmt.Sprint(p.ContainerPort) == target {
				return true
			}
		}
	}
	return false
}

// checkRBAC: the bindings name roles and service accounts that config/default
// renders, and every Deployment runs as a rendered service account.
func checkRBAC(t *testing.T, m manifests, namespace string) {
	t.Helper()
	checkSubjects := func(what string, subjects []rbacv1.Subject) {
		for _, s := range subjects {
			if _, ok := m.get("ServiceAccount", s.Namespace, s.Name); s.Kind != "ServiceAccount" || !ok {
				t.Errorf("%s binds %s %s/%s, which config/default does not render", what, s.Kind, s.Namespace, s.Name)
			}
		}
	}
	for _, u := range m.ofKind("ClusterRoleBinding") {
		var b rbacv1.ClusterRoleBinding
		convert(t, u, &b)
		if _, ok := m.get(b.RoleRef.Kind, "", b.RoleRef.Name); b.RoleRef.Kind != "ClusterRole" || !ok {
			t.Errorf("ClusterRoleBinding %s grants %s %s, which config/default does not render (is config/rbac/role.yaml generated and listed?)", b.Name, b.RoleRef.Kind, b.RoleRef.Name)
		}
		checkSubjects("ClusterRoleBinding "+b.Name, b.Subjects)
	}
	for _, u := range m.ofKind("RoleBinding") {
		var b rbacv1.RoleBinding
		convert(t, u, &b)
		if _, ok := m.get(b.RoleRef.Kind, b.Namespace, b.RoleRef.Name); b.RoleRef.Kind != "Role" || !ok {
			t.Errorf("RoleBinding %s/%s grants %s %s, which config/default does not render in %s", b.Namespace, b.Name, b.RoleRef.Kind, b.RoleRef.Name, b.Namespace)
		}
		checkSubjects("RoleBinding "+b.Namespace+"/"+b.Name, b.Subjects)
	}
	if _, ok := m.get("ClusterRole", "", managerName); !ok {
		t.Errorf("config/default renders no ClusterRole %s: config/rbac/role.yaml is generated by `make manifests`", managerName)
	}
	for _, u := range m.ofKind("Deployment") {
		var d appsv1.Deployment
		convert(t, u, &d)
		sa := d.Spec.Template.Spec.ServiceAccountName
		if sa == "" {
			continue // the namespace's default account, which has no rights
		}
		if _, ok := m.get("ServiceAccount", namespace, sa); !ok {
			t.Errorf("Deployment %s/%s runs as ServiceAccount %s, which config/default does not render", d.Namespace, d.Name, sa)
		}
	}
}

// checkHardened: every container runs as non-root on a read-only root
// filesystem, without privilege escalation or capabilities, under the
// runtime's default seccomp profile.
func checkHardened(t *testing.T, d *appsv1.Deployment) {
	t.Helper()
	pod := d.Spec.Template.Spec
	podNonRoot := pod.SecurityContext != nil && pod.SecurityContext.RunAsNonRoot != nil && *pod.SecurityContext.RunAsNonRoot
	podUser := int64(-1)
	if pod.SecurityContext != nil && pod.SecurityContext.RunAsUser != nil {
		podUser = *pod.SecurityContext.RunAsUser
	}
	if pod.SecurityContext == nil || pod.SecurityContext.SeccompProfile == nil ||
		pod.SecurityContext.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("Deployment %s/%s: set the pod's seccompProfile to RuntimeDefault", d.Namespace, d.Name)
	}
	for _, c := range slices.Concat(pod.InitContainers, pod.Containers) {
		where := fmt.Sprintf("Deployment %s/%s, container %s", d.Namespace, d.Name, c.Name)
		sc := c.SecurityContext
		if sc == nil {
			t.Errorf("%s has no securityContext", where)
			continue
		}
		nonRoot := podNonRoot
		if sc.RunAsNonRoot != nil {
			nonRoot = *sc.RunAsNonRoot
		}
		user := podUser
		if sc.RunAsUser != nil {
			user = *sc.RunAsUser
		}
		if !nonRoot || user == 0 {
			t.Errorf("%s may run as root: set runAsNonRoot: true", where)
		}
		if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
			t.Errorf("%s has a writable root filesystem: set readOnlyRootFilesystem: true", where)
		}
		if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
			t.Errorf("%s allows privilege escalation", where)
		}
		if sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, corev1.Capability("ALL")) || len(sc.Capabilities.Add) > 0 {
			t.Errorf("%s keeps capabilities: drop ALL and add none", where)
		}
	}
}

// TestPlaneInstall: the plane the install applies (kubectl apply -k
// config/plane) is the sample plane in a distributed mode, where
// config/default's enforcers follow it, and the API server and Compile
// accept it; the samples themselves, the enforcer's embedded default
// (`make run`, no Redis), stay mode local.
func TestPlaneInstall(t *testing.T) {
	kustomize := os.Getenv("KUSTOMIZE")
	if kustomize == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("KUSTOMIZE is unset under CI=true: run this test through `make test`, which installs kustomize and sets KUSTOMIZE")
		}
		t.Skip("KUSTOMIZE is unset: `make test` installs kustomize and sets it")
	}
	root := testenv.Root()
	namespace := defaultNamespace(t, root)
	sample := readYAML(t, filepath.Join(root, "config", "samples", "quotaplane.yaml"))
	if mode, _, _ := unstructured.NestedString(sample.Object, "spec", "mode"); mode != "local" {
		t.Errorf("config/samples/quotaplane.yaml is mode %q; the embedded default (make run: one process, no Redis) must stay local", mode)
	}
	objs := kustomizeBuild(t, kustomize, filepath.Join(root, "config", "plane"))
	m := index(t, objs)
	plane, ok := m.get("QuotaPlane", namespace, sample.GetName())
	if !ok {
		t.Fatalf("config/plane renders no QuotaPlane %s/%s", namespace, sample.GetName())
	}
	mode, _, _ := unstructured.NestedString(plane.Object, "spec", "mode")
	if mode != "central" && mode != "local-reconciled" {
		t.Errorf("config/plane's QuotaPlane is mode %q: behind config/default's enforcer fleet a local plane admits each limit once per pod; use central or local-reconciled", mode)
	}
	// Everything else of the samples, unchanged, in the install's namespace.
	samples, err := filepath.Glob(filepath.Join(root, "config", "samples", "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var want int
	for _, name := range samples {
		f, err := os.Open(name)
		if err != nil {
			t.Fatal(err)
		}
		docs, err := decodeAll(f)
		f.Close()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		want += len(docs)
	}
	if len(objs) != want {
		t.Errorf("config/plane renders %d objects; config/samples holds %d: list every sample file in config/samples/Kustomization", len(objs), want)
	}
	var typed []runtime.Object
	for _, u := range objs {
		if u.GetNamespace() != namespace {
			t.Errorf("%s is not in config/default's namespace %s", describe(u), namespace)
		}
		o, err := testenv.Scheme().New(u.GroupVersionKind())
		if err != nil {
			t.Fatalf("%s: %v", describe(u), err)
		}
		convert(t, u, o)
		typed = append(typed, o)
	}
	if p, problems := policy.Compile(typed); p == nil || len(problems) > 0 {
		t.Fatalf("config/plane does not compile: %v", problems)
	} else if p.Spec().Mode != mode {
		t.Fatalf("compiled mode %q, want %q", p.Spec().Mode, mode)
	}
	// The enforcers config/default runs follow this plane and are the
	// Deployment it scales.
	enforcer := deployment(t, index(t, kustomizeBuild(t, kustomize, filepath.Join(root, "config", "default"))), namespace, enforcerName)
	checkPlane(t, root, namespace, enforcer)

	env := testenv.Start(t)
	ctx := t.Context()
	if err := env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}); err != nil {
		t.Fatal(err)
	}
	for _, u := range objs {
		if err := env.Client.Create(ctx, u.DeepCopy(), client.FieldValidation(metav1.FieldValidationStrict)); err != nil {
			t.Errorf("%s: the API server rejected it: %v", describe(u), err)
		}
	}
}
