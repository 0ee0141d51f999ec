package config_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	lua "github.com/yuin/gopher-lua"
	"sigs.k8s.io/yaml"

	"github.com/quotaplane/quotaplane/pkg/testenv"
)

// TestArgoCDHealth runs the Argo CD health checks of config/argocd on the
// objects in config/argocd/testdata, which the controller tests captured
// from a real API server and manager (go test ./controllers/ with
// QUOTAPLANE_CAPTURE_ARGOCD=1): each file's name starts with the health it
// must get (and, for the other kinds, with the kind). It also checks that
// argocd-cm.yaml carries health.lua verbatim.
func TestArgoCDHealth(t *testing.T) {
	dir := filepath.Join(testenv.Root(), "config", "argocd")
	script, err := os.ReadFile(filepath.Join(dir, "health.lua"))
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(dir, "argocd-cm.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var cm struct {
		Data map[string]string `json:"data"`
	}
	if err := yaml.Unmarshal(raw, &cm); err != nil {
		t.Fatalf("argocd-cm.yaml: %v", err)
	}
	scripts := map[string]string{}
	for _, kind := range []string{"QuotaPlane", "TenantQuota", "EndpointQuota", "BurstPool"} {
		s, ok := cm.Data["resource.customizations.health.quotaplane.io_"+kind]
		if !ok {
			t.Fatalf("argocd-cm.yaml has no health check of %s", kind)
		}
		scripts[strings.ToLower(kind)] = s
	}
	if scripts["quotaplane"] != string(script) {
		t.Fatal("argocd-cm.yaml's QuotaPlane health check is not health.lua: copy health.lua into it (indented four spaces)")
	}

	files, err := filepath.Glob(filepath.Join(dir, "testdata", "*.json"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no captured objects in config/argocd/testdata (%v): run the controller tests with QUOTAPLANE_CAPTURE_ARGOCD=1", err)
	}
	seen := map[string]bool{}
	for _, name := range files {
		base := strings.TrimSuffix(filepath.Base(name), ".json")
		kind := "quotaplane"
		for k := range scripts {
			if strings.HasPrefix(base, k+"-") {
				kind, base = k, strings.TrimPrefix(base, k+"-")
			}
		}
		want := map[string]string{"healthy": "Healthy", "progressing": "Progressing", "degraded": "Degraded"}[strings.SplitN(base, "-", 2)[0]]
		if want == "" {
			t.Fatalf("%s: the name does not start with healthy-, progressing- or degraded-", name)
		}
		b, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		var obj map[string]any
		if err := json.Unmarshal(b, &obj); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		status, message, err := runHealth(scripts[kind], obj)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if status != want || message == "" {
			t.Errorf("%s: %s %q; want %s with a message", filepath.Base(name), status, message, want)
		}
		seen[kind+" "+want] = true
	}
	for _, want := range []string{"quotaplane Healthy", "quotaplane Progressing", "quotaplane Degraded", "tenantquota Healthy", "tenantquota Degraded"} {
		if !seen[want] {
			t.Errorf("no captured object covers %s", want)
		}
	}
}

// runHealth runs an Argo CD health script as Argo CD does: the object, as
// decoded JSON, in the global obj; base, table, string and math only; the
// script returns {status, message}.
func runHealth(src string, obj map[string]any) (status, message string, err error) {
	L := lua.NewState(lua.Options{SkipOpenLibs: true})
	defer L.Close()
	for _, lib := range []struct {
		name string
		open lua.LGFunction
	}{{lua.BaseLibName, lua.OpenBase}, {lua.TabLibName, lua.OpenTable}, {lua.StringLibName, lua.OpenString}, {lua.MathLibName, lua.OpenMath}} {
		if err := L.CallByParam(lua.P{Fn: L.NewFunction(lib.open), NRet: 0, Protect: true}, lua.LString(lib.name)); err != nil {
			return "", "", err
		}
	}
	L.SetGlobal("obj", toLua(L, obj))
	if err := L.DoString(src); err != nil {
		return "", "", err
	}
	hs, ok := L.Get(-1).(*lua.LTable)
	if !ok {
		return "", "", os.ErrInvalid
	}
	return lua.LVAsString(hs.RawGetString("status")), lua.LVAsString(hs.RawGetString("message")), nil
}

func toLua(L *lua.LState, v any) lua.LValue {
	switch v := v.(type) {
	case bool:
		return lua.LBool(v)
	case float64:
		return lua.LNumber(v)
	case string:
		return lua.LString(v)
	case []any:
		t := L.NewTable()
		for _, e := range v {
			t.Append(toLua(L, e))
		}
		return t
	case map[string]any:
		t := L.NewTable()
		for k, e := range v {
			t.RawSetString(k, toLua(L, e))
		}
		return t
	}
	return lua.LNil
}
