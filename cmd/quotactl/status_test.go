package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/quotaplane/quotaplane/api/v1alpha1"
	"github.com/quotaplane/quotaplane/config/samples"
	"github.com/quotaplane/quotaplane/pkg/planestatus"
	"github.com/quotaplane/quotaplane/pkg/policy"
	"github.com/quotaplane/quotaplane/pkg/redistest"
	"github.com/quotaplane/quotaplane/pkg/store"
	"github.com/quotaplane/quotaplane/pkg/testenv"
)

// publishedPlanes starts a Redis holding two planes as a manager and
// enforcers leave them: default/main at v2 with one enforcer on v2 and a
// degraded one still on v1, and other/edge at v1 with no enforcer.
func publishedPlanes(t *testing.T) *redistest.Server {
	t.Helper()
	srv := redistest.Start(t)
	rdb := srv.Client()
	ctx := context.Background()
	p, err := policy.LoadFS(samples.FS)
	if err != nil {
		t.Fatal(err)
	}
	main, err := store.New(rdb, "default/main")
	if err != nil {
		t.Fatal(err)
	}
	changed, err := p.Override(policy.Overrides{GlobalPerSecond: 12000})
	if err != nil {
		t.Fatal(err)
	}
	for _, pol := range []*policy.Policy{p, changed} {
		if _, _, err := main.Publish(ctx, pol); err != nil {
			t.Fatal(err)
		}
	}
	for _, r := range []store.EnforcerReport{
		{ID: "enforcer-a", PolicyVersion: 2, DecisionsPerSec: 1500, Mode: "local"},
		{ID: "enforcer-b", PolicyVersion: 1, DecisionsPerSec: 20, Mode: "local", Degraded: true},
	} {
		if err := main.ReportState(ctx, r, time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	// A second plane: the samples' objects under another name.
	objs, err := policy.ReadFS(samples.FS)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		if m, ok := o.(metav1.Object); ok {
			m.SetNamespace("other")
			if qp, ok := o.(*v1alpha1.QuotaPlane); ok {
				qp.Name = "edge"
			}
		}
	}
	edgePolicy, problems := policy.Compile(objs)
	if len(problems) > 0 {
		t.Fatal(problems)
	}
	edge, err := store.New(rdb, "other/edge")
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := edge.Publish(ctx, edgePolicy); err != nil {
		t.Fatal(err)
	}
	return srv
}

func TestStatusFromRedis(t *testing.T) {
	srv := publishedPlanes(t)
	code, out, errOut := quotactl(t, "status", "--redis-addr", srv.Addr)
	if code != 0 {
		t.Fatalf("status: exit %d: %s", code, errOut)
	}
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`\ndefault/main +v2 +[0-9a-f]{12} +1,2 +local +2 +1 +1 +in progress: 1 of 2 on v2 \(1 on v1, 1 on v2\)\n`),
		regexp.MustCompile(`\nother/edge +v1 +[0-9a-f]{12} +1 +local +0 +0 +0 +no enforcer reports\n`),
		regexp.MustCompile(`\ndefault/main +enforcer-b +v1 +local +true +20 `),
	} {
		if !want.MatchString(out) {
			t.Errorf("status lacks %s:\n%s", want, out)
		}
	}
	// --exit-code fails on the rollout in progress; --plane picks planes.
	code, out, _ = quotactl(t, "status", "--redis-addr", srv.Addr, "--plane", "other/edge", "-o", "json", "--exit-code")
	var st planestatus.Status
	if err := json.Unmarshal([]byte(out), &st); err != nil || len(st.Planes) != 1 || st.Planes[0].Plane != "other/edge" {
		t.Fatalf("status --plane other/edge -o json: %v\n%s", err, out)
	}
	if code != 1 {
		t.Errorf("status --exit-code of a plane without enforcers: exit %d, want 1", code)
	}
	code, out, _ = quotactl(t, "status", "--redis-addr", srv.Addr, "--plane", "default/main", "-o", "json")
	if err := json.Unmarshal([]byte(out), &st); err != nil || code != 0 {
		t.Fatalf("status -o json: exit %d, %v", code, err)
	}
	if p := st.Planes[0]; p.Version != 2 || !slices.Equal(p.Kept, []int64{1, 2}) || p.Degraded != 1 || p.OnCurrent != 1 || len(p.Enforcers) != 2 {
		t.Errorf("default/main: %+v", p)
	}
	code, out, _ = quotactl(t, "status", "--redis-addr", srv.Addr, "--plane", "nowhere/none")
	if code != 0 || !strings.Contains(out, "no policy published in Redis") {
		t.Errorf("status of a plane Redis does not hold: exit %d\n%s", code, out)
	}

	// Errors say what is wrong.
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"status"}, 2, "name a source: --redis-addr"},
		{[]string{"status", "--redis-addr", srv.Addr, "--plane", "main"}, 2, `--plane "main": want namespace/name`},
		{[]string{"status", "--redis-addr", "127.0.0.1:1", "--timeout", "2s"}, 1, "redis 127.0.0.1:1: store: list the planes:"},
		{[]string{"status", "--kubernetes", "--kubeconfig", filepath.Join(t.TempDir(), "none")}, 1, "--kubernetes: load the kubeconfig"},
	} {
		code, _, errOut := quotactl(t, tc.args...)
		if code != tc.code || !strings.Contains(errOut, tc.want) {
			t.Errorf("%q: exit %d, stderr %q; want exit %d and %q", tc.args, code, errOut, tc.code, tc.want)
		}
	}
}

// With --kubernetes, the QuotaPlanes' status from a real API server joins
// Redis's view of the same plane.
func TestStatusWithKubernetes(t *testing.T) {
	srv := publishedPlanes(t)
	env := testenv.Start(t)
	ctx := context.Background()
	objs, err := policy.ReadFS(samples.FS)
	if err != nil {
		t.Fatal(err)
	}
	qp := objs[slices.IndexFunc(objs, func(o runtime.Object) bool { _, ok := o.(*v1alpha1.QuotaPlane); return ok })].(*v1alpha1.QuotaPlane)
	if err := env.Client.Create(ctx, qp); err != nil {
		t.Fatal(err)
	}
	qp.Status.PublishedVersion, qp.Status.Enforcers, qp.Status.EnforcersReady, qp.Status.Replicas = 2, 2, 1, 2
	meta.SetStatusCondition(&qp.Status.Conditions, metav1.Condition{Type: v1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: "Published", Message: "policy v2 published"})
	meta.SetStatusCondition(&qp.Status.Conditions, metav1.Condition{Type: v1alpha1.ConditionEnforced, Status: metav1.ConditionFalse, Reason: "RollingOut", Message: "1 of 2 enforcers run v2"})
	if err := env.Client.Status().Update(ctx, qp); err != nil {
		t.Fatal(err)
	}
	user, err := env.ControlPlane.AddUser(envtest.User{Name: "operator", Groups: []string{"system:masters"}}, nil)
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
	code, out, errOut := quotactl(t, "status", "--redis-addr", srv.Addr, "--kubernetes", "--kubeconfig", path)
	if code != 0 {
		t.Fatalf("status --kubernetes: exit %d: %s", code, errOut)
	}
	t.Logf("quotactl status --redis-addr %s --kubernetes --kubeconfig %s:\n%s", srv.Addr, path, out)
	if !regexp.MustCompile(`\ndefault/main +True +Published +False +v2 +1/2 +2 +0 +0 +policy v2 published\n`).MatchString(out) {
		t.Errorf("status --kubernetes lacks the QuotaPlane's row:\n%s", out)
	}
	// Kubernetes alone.
	code, out, errOut = quotactl(t, "status", "--kubernetes", "--kubeconfig", path, "-o", "json")
	var st planestatus.Status
	if err := json.Unmarshal([]byte(out), &st); err != nil || code != 0 {
		t.Fatalf("status --kubernetes -o json: exit %d, %v, %s", code, err, errOut)
	}
	if len(st.Planes) != 1 || st.Planes[0].Kubernetes == nil || st.Planes[0].Kubernetes.Enforced != "False" || st.Planes[0].Rollout != "not in Redis" {
		t.Errorf("status --kubernetes alone: %+v", st.Planes)
	}
}
