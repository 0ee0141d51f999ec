package controllers

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	lua "github.com/yuin/gopher-lua"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/quotaplane/quotaplane/pkg/testenv"
)

// argoHealth runs the shipped Argo CD health check, config/argocd/health.lua,
// on obj as Argo CD does (the script reads the global obj, the object as
// JSON, and returns {status, message}; base, table, string and math only).
// With QUOTAPLANE_CAPTURE_ARGOCD set, it also writes obj to
// config/argocd/testdata/<status>-<name>.json, the real status objects
// config's test checks the script against without a cluster.
func argoHealth(t *testing.T, obj client.Object, capture string) (status, message string) {
	t.Helper()
	root := testenv.Root()
	src, err := os.ReadFile(filepath.Join(root, "config", "argocd", "health.lua"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	var fields map[string]any
	if err := json.Unmarshal(b, &fields); err != nil {
		t.Fatal(err)
	}
	status, message, err = runHealthLua(string(src), fields)
	if err != nil {
		t.Fatalf("config/argocd/health.lua on %s: %v", obj.GetName(), err)
	}
	if capture != "" {
		captureObject(t, obj, strings.ToLower(status)+"-"+capture)
	}
	return status, message
}

// captureObject writes obj to config/argocd/testdata/<name>.json when
// QUOTAPLANE_CAPTURE_ARGOCD is set: real objects for config's test of the
// Argo CD health checks.
func captureObject(t *testing.T, obj client.Object, name string) {
	t.Helper()
	if os.Getenv("QUOTAPLANE_CAPTURE_ARGOCD") == "" {
		return
	}
	b, err := json.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	var fields map[string]any
	if err := json.Unmarshal(b, &fields); err != nil {
		t.Fatal(err)
	}
	delete(fields["metadata"].(map[string]any), "managedFields")
	out, _ := json.MarshalIndent(fields, "", "  ")
	path := filepath.Join(testenv.Root(), "config", "argocd", "testdata", name+".json")
	if err := os.WriteFile(path, append(out, '\n'), 0o644); err != nil {
		t.Fatal(err)
	}
}

// runHealthLua runs an Argo CD health script on an object given as decoded
// JSON, as config's test does (test packages cannot share code).
func runHealthLua(src string, obj map[string]any) (status, message string, err error) {
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
		return "", "", errors.New("the script did not return a table")
	}
	return lua.LVAsString(hs.RawGetString("status")), lua.LVAsString(hs.RawGetString("message")), nil
}

// toLua converts decoded JSON to Lua values, as Argo CD does.
func toLua(L *lua.LState, v any) lua.LValue {
	switch v := v.(type) {
	case nil:
		return lua.LNil
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
