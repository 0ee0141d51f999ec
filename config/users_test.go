package config_test

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/quotaplane/quotaplane/api/v1alpha1"
	"github.com/quotaplane/quotaplane/pkg/poll"
	"github.com/quotaplane/quotaplane/pkg/testenv"
)

// TestNamespaceUsers checks, on a real API server, what namespace users
// get: the ClusterRoles of config/rbac/quota_roles.yaml, and the columns
// `kubectl get` and `kubectl get -o wide` print.
//
// The roles reach users through aggregation into the built-in view, edit
// and admin roles, which kube-controller-manager's clusterrole-aggregation
// controller performs; envtest runs no controller manager, so aggregation
// itself cannot happen here. The test checks the two halves instead: the
// live built-in roles' aggregationRule selects our roles by their labels
// (the API server's own bootstrap roles, not a copy of them), and a user
// bound directly to each of our roles (a RoleBinding in one namespace) may
// do exactly what the role promises there, and nothing in another
// namespace: subject access reviews for every kind and verb, and real
// requests made as the user (impersonation).
func TestNamespaceUsers(t *testing.T) {
	root := testenv.Root()
	f, err := os.Open(filepath.Join(root, "config", "rbac", "quota_roles.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	objs, err := decodeAll(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	roles := map[string]*rbacv1.ClusterRole{}
	for _, u := range objs {
		var r rbacv1.ClusterRole
		convert(t, u, &r)
		roles[r.Name] = &r
	}
	view, edit := roles["quotaplane-view"], roles["quotaplane-edit"]
	if len(roles) != 2 || view == nil || edit == nil {
		t.Fatalf("config/rbac/quota_roles.yaml holds %v; want the ClusterRoles quotaplane-view and quotaplane-edit", slices.Sorted(maps.Keys(roles)))
	}

	env := testenv.Start(t)
	ctx := t.Context()
	for _, r := range roles {
		if err := env.Client.Create(ctx, r.DeepCopy(), client.FieldValidation(metav1.FieldValidationStrict)); err != nil {
			t.Fatalf("ClusterRole %s: %v", r.Name, err)
		}
	}

	t.Run("aggregation labels", func(t *testing.T) {
		// Which built-in role must fold in which of ours.
		for builtin, want := range map[string]*rbacv1.ClusterRole{"view": view, "edit": edit, "admin": edit} {
			var b rbacv1.ClusterRole
			if err := env.Client.Get(ctx, client.ObjectKey{Name: builtin}, &b); err != nil {
				t.Fatalf("the API server's built-in ClusterRole %s: %v", builtin, err)
			}
			if !aggregates(t, &b, want) {
				t.Errorf("the built-in ClusterRole %s (aggregating %v) does not select %s, labelled %v", builtin, b.AggregationRule, want.Name, want.Labels)
			}
		}
		var b rbacv1.ClusterRole
		if err := env.Client.Get(ctx, client.ObjectKey{Name: "view"}, &b); err != nil {
			t.Fatal(err)
		}
		if aggregates(t, &b, edit) {
			t.Errorf("the built-in view role would fold in %s: viewers could write quota objects", edit.Name)
		}
	})

	if err := env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-a"}}); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-b"}}); err != nil {
		t.Fatal(err)
	}
	for user, role := range map[string]string{"alice": view.Name, "bob": edit.Name} {
		rb := &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: user},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
			Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}},
		}
		if err := env.Client.Create(ctx, rb); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("access reviews", func(t *testing.T) {
		resources := crdPlurals(t, root)
		read := []string{"get", "list", "watch"}
		write := []string{"create", "update", "patch", "delete", "deletecollection"}
		for _, resource := range resources {
			for _, verb := range slices.Concat(read, write) {
				for _, c := range []struct {
					user, namespace, subresource string
					want                         bool
				}{
					{"alice", "team-a", "", slices.Contains(read, verb)},
					{"bob", "team-a", "", true},
					{"alice", "team-b", "", false},
					{"bob", "team-b", "", false},
					// status is the manager's to write
					{"alice", "team-a", "status", verb == "get"},
					{"bob", "team-a", "status", verb == "get"},
				} {
					if c.subresource != "" && !slices.Contains([]string{"get", "update", "patch"}, verb) {
						continue
					}
					sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
						User: c.user,
						ResourceAttributes: &authorizationv1.ResourceAttributes{
							Namespace: c.namespace, Verb: verb, Group: v1alpha1.GroupVersion.Group,
							Resource: resource, Subresource: c.subresource,
						},
					}}
					if err := env.Client.Create(ctx, sar); err != nil {
						t.Fatal(err)
					}
					if sar.Status.Allowed != c.want {
						t.Errorf("%s %s %s/%s in %s: allowed %v, want %v (%s)", c.user, verb, resource, c.subresource, c.namespace, sar.Status.Allowed, c.want, sar.Status.Reason)
					}
				}
			}
		}
	})

	t.Run("impersonation", func(t *testing.T) {
		as := func(user string) client.Client {
			cfg := rest.CopyConfig(env.Config)
			cfg.Impersonate = rest.ImpersonationConfig{UserName: user}
			c, err := client.New(cfg, client.Options{Scheme: env.Scheme})
			if err != nil {
				t.Fatal(err)
			}
			return c
		}
		alice, bob := as("alice"), as("bob")
		tq := func(ns string) *v1alpha1.TenantQuota {
			return &v1alpha1.TenantQuota{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "acme"},
				Spec:       v1alpha1.TenantQuotaSpec{Tenant: "acme", Limit: &v1alpha1.Limit{Rate: 10}},
			}
		}
		if err := alice.Create(ctx, tq("team-a")); !apierrors.IsForbidden(err) {
			t.Errorf("the viewer alice creates a TenantQuota in team-a: %v, want Forbidden", err)
		}
		created := tq("team-a")
		if err := bob.Create(ctx, created); err != nil {
			t.Fatalf("the editor bob creates a TenantQuota in team-a: %v", err)
		}
		var list v1alpha1.TenantQuotaList
		if err := alice.List(ctx, &list, client.InNamespace("team-a")); err != nil || len(list.Items) != 1 {
			t.Errorf("the viewer alice lists TenantQuotas in team-a: %d, %v; want bob's one", len(list.Items), err)
		}
		if err := alice.List(ctx, &list, client.InNamespace("team-b")); !apierrors.IsForbidden(err) {
			t.Errorf("alice lists TenantQuotas in team-b, where she has no binding: %v, want Forbidden", err)
		}
		if err := bob.Create(ctx, tq("team-b")); !apierrors.IsForbidden(err) {
			t.Errorf("bob creates a TenantQuota in team-b, where he has no binding: %v, want Forbidden", err)
		}
		created.Status.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: "Published", LastTransitionTime: metav1.Now()}}
		if err := bob.Status().Update(ctx, created); !apierrors.IsForbidden(err) {
			t.Errorf("the editor bob writes a TenantQuota's status: %v, want Forbidden (the manager's to write)", err)
		}
		if err := bob.Delete(ctx, created); err != nil {
			t.Errorf("the editor bob deletes his TenantQuota: %v", err)
		}
	})

	t.Run("printer columns", func(t *testing.T) {
		plane := &v1alpha1.QuotaPlane{
			ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "main"},
			Spec: v1alpha1.QuotaPlaneSpec{
				Global: v1alpha1.Limit{Rate: 100},
				Mode:   v1alpha1.ModeCentral,
				Tiers:  []v1alpha1.Tier{{Name: "free", Weight: 1, Tenant: &v1alpha1.Limit{Rate: 10}}},
			},
		}
		if err := env.Client.Create(ctx, plane); err != nil {
			t.Fatal(err)
		}
		now := metav1.Now()
		plane.Status.PublishedVersion = 7
		plane.Status.EnforcersReady, plane.Status.Enforcers, plane.Status.Replicas = 2, 3, 4
		plane.Status.Conditions = []metav1.Condition{
			{Type: v1alpha1.ConditionReady, Status: metav1.ConditionFalse, Reason: "Held", Message: "tier gold is gone while tenant acme uses it", LastTransitionTime: now},
			{Type: v1alpha1.ConditionEnforced, Status: metav1.ConditionFalse, Reason: "RollingOut", Message: "enforcer-x runs version 6", LastTransitionTime: now},
		}
		if err := env.Client.Status().Update(ctx, plane); err != nil {
			t.Fatal(err)
		}
		table := getTable(t, env.Config, "/apis/quotaplane.io/v1alpha1/namespaces/team-a/quotaplanes")
		// Each column, the cell it must show, and whether kubectl get shows
		// it without -o wide (priority 0).
		want := []struct {
			name  string
			cell  any
			plain bool
		}{
			{"Version", int64(7), true},
			{"Ready", "False", true},
			{"Reason", "Held", true},
			{"Enforced", "False", true},
			{"Rollout", "RollingOut", false},
			{"Enforcers", int64(2), true},
			{"Fleet", int64(3), false},
			{"Replicas", int64(4), false},
			{"Message", "tier gold is gone while tenant acme uses it", false},
		}
		if len(table.Rows) != 1 {
			t.Fatalf("the table has %d rows, want the one QuotaPlane", len(table.Rows))
		}
		for _, w := range want {
			i := slices.IndexFunc(table.ColumnDefinitions, func(c metav1.TableColumnDefinition) bool { return c.Name == w.name })
			if i < 0 {
				t.Errorf("kubectl get qp has no column %s", w.name)
				continue
			}
			if shown := table.ColumnDefinitions[i].Priority == 0; shown != w.plain {
				t.Errorf("column %s: shown without -o wide %v, want %v", w.name, shown, w.plain)
			}
			if got := fmt.Sprint(table.Rows[0].Cells[i]); got != fmt.Sprint(w.cell) {
				t.Errorf("column %s shows %q, want %q", w.name, got, fmt.Sprint(w.cell))
			}
		}
		// Every kind says why it is not Ready: reason and message columns.
		for _, resource := range crdPlurals(t, root) {
			table := getTable(t, env.Config, "/apis/quotaplane.io/v1alpha1/namespaces/team-a/"+resource)
			var names []string
			for _, c := range table.ColumnDefinitions {
				names = append(names, c.Name)
			}
			if !slices.Contains(names, "Reason") || !slices.Contains(names, "Message") {
				t.Errorf("kubectl get %s -o wide shows %v: want Ready's Reason and Message", resource, names)
			}
		}
	})
}

// aggregates reports whether builtin's aggregationRule selects role.
func aggregates(t *testing.T, builtin, role *rbacv1.ClusterRole) bool {
	t.Helper()
	if builtin.AggregationRule == nil {
		return false
	}
	for _, s := range builtin.AggregationRule.ClusterRoleSelectors {
		sel, err := metav1.LabelSelectorAsSelector(&s)
		if err != nil {
			t.Fatal(err)
		}
		if sel.Matches(labels.Set(role.Labels)) {
			return true
		}
	}
	return false
}

// crdPlurals are the resources of every CRD in config/crd/bases.
func crdPlurals(t *testing.T, root string) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(root, "config", "crd", "bases", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no CRDs in config/crd/bases (%v)", err)
	}
	var plurals []string
	for _, f := range files {
		crd := readYAML(t, f)
		plural, _, _ := unstructured.NestedString(crd.Object, "spec", "names", "plural")
		plurals = append(plurals, plural)
	}
	return plurals
}

// getTable lists path as kubectl get does: as a meta.k8s.io Table, whose
// columns are the CRD's printer columns. A resource first listed right
// after its CRD was installed may answer 429 while its storage initializes,
// as kubectl would retry.
func getTable(t *testing.T, cfg *rest.Config, path string) *metav1.Table {
	t.Helper()
	httpClient, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	u, err := url.JoinPath(cfg.Host, path)
	if err != nil {
		t.Fatal(err)
	}
	var body []byte
	poll.Until(t, 30*time.Second, "GET "+u+" as a Table", func() bool {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, u, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io")
		resp, err := httpClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, err = io.ReadAll(resp.Body)
		if err == nil && resp.StatusCode == http.StatusTooManyRequests {
			return false
		}
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s as a Table: %s %v\n%s", u, resp.Status, err, body)
		}
		return true
	})
	var table metav1.Table
	if err := json.Unmarshal(body, &table); err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	return &table
}
