package config_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/quotaplane/quotaplane/pkg/testenv"
)

// promtool finds promtool (Debian's prometheus package, which `make test`
// installs): missing, the test skips, but fails under CI=true.
func promtool(t *testing.T) string {
	t.Helper()
	path, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("promtool is missing under CI=true: run the tests through `make test`, which installs Debian's prometheus package")
		}
		t.Skip("promtool is missing: `make prometheus` installs it (Debian's prometheus package)")
	}
	return path
}

// TestPrometheusRules checks config/prometheus: promtool accepts the rules
// file and its unit tests (quotaplane.rules.test.yaml) pass; the
// PrometheusRule holds the same groups (go run ./hack/grafana writes it);
// docs/observability.md has a runbook entry for every alert.
func TestPrometheusRules(t *testing.T) {
	bin := promtool(t)
	dir := filepath.Join(testenv.Root(), "config", "prometheus")
	for _, args := range [][]string{{"check", "rules", "quotaplane.rules.yaml"}, {"test", "rules", "quotaplane.rules.test.yaml"}} {
		cmd := exec.Command(bin, args...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}

	type rule struct {
		Record      string            `json:"record"`
		Alert       string            `json:"alert"`
		Expr        string            `json:"expr"`
		For         string            `json:"for"`
		Labels      map[string]string `json:"labels"`
		Annotations map[string]string `json:"annotations"`
	}
	type groups struct {
		Groups []struct {
			Name  string `json:"name"`
			Rules []rule `json:"rules"`
		} `json:"groups"`
	}
	var plain groups
	var operator struct {
		APIVersion string         `json:"apiVersion"`
		Kind       string         `json:"kind"`
		Metadata   map[string]any `json:"metadata"`
		Spec       groups         `json:"spec"`
	}
	read := func(name string, v any) {
		raw, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if err := yaml.UnmarshalStrict(raw, v); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	read("quotaplane.rules.yaml", &plain)
	read("prometheusrule.yaml", &operator)
	if operator.APIVersion != "monitoring.coreos.com/v1" || operator.Kind != "PrometheusRule" || !reflect.DeepEqual(plain, operator.Spec) {
		t.Errorf("prometheusrule.yaml is not quotaplane.rules.yaml's groups: run go run ./hack/grafana")
	}
	docs, err := os.ReadFile(filepath.Join(testenv.Root(), "docs", "observability.md"))
	if err != nil {
		t.Fatal(err)
	}
	alerts := 0
	for _, g := range plain.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			alerts++
			if !bytes.Contains(docs, []byte("`"+r.Alert+"`")) {
				t.Errorf("docs/observability.md has no runbook entry for %s", r.Alert)
			}
			if r.Labels["severity"] == "" || r.Annotations["summary"] == "" {
				t.Errorf("alert %s lacks a severity or a summary", r.Alert)
			}
		}
	}
	if alerts != 7 {
		t.Errorf("%d alerts; the plane has seven conditions to alert on", alerts)
	}
}

// TestPrometheusMonitors: the ServiceMonitor selects the manager's metrics
// Service by its labels and port, the PodMonitor the enforcer pods by
// their labels and admin port, as config/manager and config/enforcer name
// them.
func TestPrometheusMonitors(t *testing.T) {
	type selector struct {
		MatchLabels map[string]string `json:"matchLabels"`
	}
	type monitor struct {
		Kind string `json:"kind"`
		Spec struct {
			Selector            selector                `json:"selector"`
			Endpoints           []struct{ Port string } `json:"endpoints"`
			PodMetricsEndpoints []struct{ Port string } `json:"podMetricsEndpoints"`
		} `json:"spec"`
	}
	type object struct {
		Kind     string `json:"kind"`
		Metadata struct {
			Labels map[string]string `json:"labels"`
		} `json:"metadata"`
		Spec struct {
			Ports    []struct{ Name string } `json:"ports"`
			Template struct {
				Metadata struct {
					Labels map[string]string `json:"labels"`
				} `json:"metadata"`
				Spec struct {
					Containers []struct {
						Ports []struct{ Name string } `json:"ports"`
					} `json:"containers"`
				} `json:"spec"`
			} `json:"template"`
		} `json:"spec"`
	}
	docs := func(path string) [][]byte {
		raw, err := os.ReadFile(filepath.Join(testenv.Root(), path))
		if err != nil {
			t.Fatal(err)
		}
		return bytes.Split(raw, []byte("\n---\n"))
	}
	matches := func(sel, labels map[string]string) bool {
		for k, v := range sel {
			if labels[k] != v {
				return false
			}
		}
		return len(sel) > 0
	}
	var monitors []monitor
	for _, d := range docs("config/prometheus/monitors.yaml") {
		var m monitor
		if err := yaml.Unmarshal(d, &m); err != nil {
			t.Fatal(err)
		}
		monitors = append(monitors, m)
	}
	if len(monitors) != 2 || monitors[0].Kind != "ServiceMonitor" || monitors[1].Kind != "PodMonitor" {
		t.Fatalf("monitors.yaml: want a ServiceMonitor and a PodMonitor, got %+v", monitors)
	}
	var service, deployment object
	for _, d := range docs("config/manager/service.yaml") {
		if err := yaml.Unmarshal(d, &service); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range docs("config/enforcer/enforcer.yaml") {
		var o object
		if err := yaml.Unmarshal(d, &o); err != nil {
			t.Fatal(err)
		}
		if o.Kind == "Deployment" {
			deployment = o
		}
	}
	sm, pm := monitors[0].Spec, monitors[1].Spec
	if !matches(sm.Selector.MatchLabels, service.Metadata.Labels) || len(sm.Endpoints) != 1 || len(service.Spec.Ports) == 0 || sm.Endpoints[0].Port != service.Spec.Ports[0].Name {
		t.Errorf("the ServiceMonitor (%+v) does not select the manager's metrics Service (labels %v, ports %+v)", sm, service.Metadata.Labels, service.Spec.Ports)
	}
	var ports []string
	for _, c := range deployment.Spec.Template.Spec.Containers {
		for _, p := range c.Ports {
			ports = append(ports, p.Name)
		}
	}
	if !matches(pm.Selector.MatchLabels, deployment.Spec.Template.Metadata.Labels) || len(pm.PodMetricsEndpoints) != 1 || !strings.Contains(" "+strings.Join(ports, " ")+" ", " "+pm.PodMetricsEndpoints[0].Port+" ") {
		t.Errorf("the PodMonitor (%+v) does not select the enforcer pods (labels %v, ports %v)", pm, deployment.Spec.Template.Metadata.Labels, ports)
	}
}
