package gateways

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"
	kyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	// The types the samples' typed_config fields name, so that they
	// resolve and are checked too.
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_authz/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"

	sampleplane "github.com/quotaplane/quotaplane/config/samples"
	"github.com/quotaplane/quotaplane/pkg/policy"
)

// documents reads every YAML document of a sample file, strictly (a key
// given twice is an error), as JSON.
func documents(t *testing.T, path string) [][]byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var docs [][]byte
	r := kyaml.NewYAMLReader(bufio.NewReader(f))
	for {
		raw, err := r.Read()
		if errors.Is(err, io.EOF) {
			return docs
		}
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		var v map[string]any
		if err := yaml.UnmarshalStrict(raw, &v); err != nil {
			t.Fatalf("%s: document %d: %v", path, len(docs)+1, err)
		}
		if v == nil {
			continue // only comments
		}
		js, err := yaml.YAMLToJSONStrict(raw)
		if err != nil {
			t.Fatalf("%s: document %d: %v", path, len(docs)+1, err)
		}
		docs = append(docs, js)
	}
}

// TestSamplesParse: every YAML file under config/samples/gateways parses
// (a typo that breaks YAML, or a key written twice, fails here); each
// document is an Envoy bootstrap or a Kubernetes object with apiVersion,
// kind and a name; the demo plane compiles; and the
// directory does not change the sample plane (only config/samples' top
// level is embedded and read).
func TestSamplesParse(t *testing.T) {
	var files int
	err := filepath.WalkDir(samples, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || (filepath.Ext(path) != ".yaml" && filepath.Ext(path) != ".yml") {
			return err
		}
		files++
		docs := documents(t, path)
		if len(docs) == 0 {
			t.Errorf("%s: no YAML document", path)
		}
		for i, doc := range docs {
			var obj struct {
				APIVersion      string `json:"apiVersion"`
				Kind            string `json:"kind"`
				Metadata        struct{ Name string }
				StaticResources any `json:"static_resources"`
			}
			if err := yaml.Unmarshal(doc, &obj); err != nil {
				t.Errorf("%s: document %d: %v", path, i+1, err)
				continue
			}
			if obj.StaticResources == nil && (obj.APIVersion == "" || obj.Kind == "" || obj.Metadata.Name == "") {
				t.Errorf("%s: document %d is neither an Envoy bootstrap (static_resources) nor an object with apiVersion, kind and metadata.name", path, i+1)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 8 {
		t.Errorf("%d YAML files under %s; want the samples (8 at least)", files, samples)
	}

	p, err := policy.LoadDir(plane)
	if err != nil {
		t.Fatalf("the demo plane: %v", err)
	}
	if p.Plane() != "main" || p.KeyBinding() != policy.KeyBindingBound {
		t.Errorf("the demo plane is %s with keyBinding %s; the samples want main, bound", p.Plane(), p.KeyBinding())
	}

	embedded, err := policy.ReadFS(sampleplane.FS)
	if err != nil {
		t.Fatal(err)
	}
	onDisk, err := policy.ReadDir(filepath.Join(root, "config", "samples"))
	if err != nil {
		t.Fatal(err)
	}
	if len(embedded) != len(onDisk) {
		t.Errorf("config/samples has %d quota objects embedded and %d on disk: a subdirectory changed the sample plane", len(embedded), len(onDisk))
	}
}

// TestEnvoyConfigs: the Envoy samples are valid Envoy protos — every field
// and typed_config type known, every constraint Envoy's API states met —
// as far as that can be known without an Envoy: the bootstraps whole, and
// each of the Istio EnvoyFilter's patches as the proto it patches.
func TestEnvoyConfigs(t *testing.T) {
	strict := protojson.UnmarshalOptions{} // unknown fields are errors
	validate := func(what string, m proto.Message) {
		for _, err := range validateDeep(m.ProtoReflect()) {
			t.Errorf("%s: %v", what, err)
		}
	}
	for _, name := range []string{"envoy-ratelimit.yaml", "envoy-ext-authz.yaml"} {
		docs := documents(t, filepath.Join(samples, name))
		var b bootstrapv3.Bootstrap
		if err := strict.Unmarshal(docs[0], &b); err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		validate(name, &b)
		if len(b.GetStaticResources().GetClusters()) != 2 {
			t.Errorf("%s: %d clusters; want app and quotaplane", name, len(b.GetStaticResources().GetClusters()))
		}
	}

	var filter struct {
		Spec struct {
			ConfigPatches []struct {
				ApplyTo string `json:"applyTo"`
				Patch   struct {
					Value any `json:"value"`
				}
			} `json:"configPatches"`
		}
	}
	docs := documents(t, filepath.Join(samples, "istio-ratelimit.yaml"))
	if err := yaml.Unmarshal(docs[0], &filter); err != nil {
		t.Fatal(err)
	}
	if len(filter.Spec.ConfigPatches) != 3 {
		t.Fatalf("istio-ratelimit.yaml: %d patches; want the filter, the virtual host's and a route's", len(filter.Spec.ConfigPatches))
	}
	unmarshal := func(what string, js []byte, m proto.Message) bool {
		if err := strict.Unmarshal(js, m); err != nil {
			t.Errorf("%s: %v", what, err)
			return false
		}
		return true
	}
	// A MERGE patch gives part of a message: its rate limits are checked.
	validateLimits := func(what string, limits []*routev3.RateLimit) {
		if len(limits) == 0 {
			t.Errorf("%s: no rate limits", what)
		}
		for _, l := range limits {
			validate(what, l)
		}
	}
	for _, patch := range filter.Spec.ConfigPatches {
		value, err := json.Marshal(patch.Patch.Value)
		if err != nil {
			t.Fatal(err)
		}
		what := "istio-ratelimit.yaml " + patch.ApplyTo
		switch patch.ApplyTo {
		case "HTTP_FILTER":
			var f hcmv3.HttpFilter
			if unmarshal(what, value, &f) {
				validate(what, &f)
			}
		case "VIRTUAL_HOST":
			var vh routev3.VirtualHost
			if unmarshal(what, value, &vh) {
				validateLimits(what, vh.GetRateLimits())
			}
		case "HTTP_ROUTE":
			var r routev3.Route
			if unmarshal(what, value, &r) {
				validateLimits(what, r.GetRoute().GetRateLimits())
			}
		default:
			t.Errorf("%s: a patch the test does not know", what)
		}
	}
}

// TestCaddyfileIsValid: Caddy adapts and provisions the sample Caddyfile
// (with the addresses it defaults to) and finds it formatted.
func TestCaddyfileIsValid(t *testing.T) {
	caddy := caddyBinary(t)
	home := t.TempDir()
	path := filepath.Join(samples, "Caddyfile")
	cmd := exec.Command(caddy, "validate", "--config", path, "--adapter", "caddyfile")
	cmd.Env = append(os.Environ(), "HOME="+home, "XDG_DATA_HOME="+home, "XDG_CONFIG_HOME="+home)
	if out, err := cmd.CombinedOutput(); err != nil || !bytes.Contains(out, []byte("Valid configuration")) {
		t.Fatalf("caddy validate %s: %v\n%s", path, err, out)
	}
	formatted, err := exec.Command(caddy, "fmt", path).Output()
	if err != nil {
		t.Fatalf("caddy fmt %s: %v", path, err)
	}
	if current, _ := os.ReadFile(path); !bytes.Equal(current, formatted) {
		t.Errorf("%s is not formatted: caddy fmt --overwrite %s", path, path)
	}
}

// TestNginxConfIsValid: nginx -t accepts the sample nginx.conf as it is.
func TestNginxConfIsValid(t *testing.T) {
	nginx := nginxBinary(t)
	dir := t.TempDir()
	conf, err := filepath.Abs(filepath.Join(samples, "nginx.conf"))
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(nginx, "-t", "-p", dir, "-c", conf, "-e", filepath.Join(dir, "error.log")).CombinedOutput()
	if err != nil || !bytes.Contains(out, []byte("test is successful")) {
		t.Fatalf("nginx -t -c %s: %v\n%s", conf, err, out)
	}
}

// validateDeep checks m and every message inside it against the
// constraints of Envoy's API (protoc-gen-validate's ValidateAll), also
// inside google.protobuf.Any fields, which ValidateAll leaves unopened:
// Envoy's typed_config, where the filters' own configuration is.
func validateDeep(m protoreflect.Message) []error {
	var errs []error
	if v, ok := m.Interface().(interface{ ValidateAll() error }); ok {
		if err := v.ValidateAll(); err != nil {
			errs = append(errs, err)
		}
	}
	if a, ok := m.Interface().(*anypb.Any); ok {
		inner, err := a.UnmarshalNew()
		if err != nil {
			return append(errs, fmt.Errorf("%s: %w", a.GetTypeUrl(), err))
		}
		return append(errs, validateDeep(inner.ProtoReflect())...)
	}
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.IsMap():
			if fd.MapValue().Message() != nil {
				v.Map().Range(func(_ protoreflect.MapKey, mv protoreflect.Value) bool {
					errs = append(errs, validateDeep(mv.Message())...)
					return true
				})
			}
		case fd.Message() == nil:
		case fd.IsList():
			for i := range v.List().Len() {
				errs = append(errs, validateDeep(v.List().Get(i).Message())...)
			}
		default:
			errs = append(errs, validateDeep(v.Message())...)
		}
		return true
	})
	return errs
}
