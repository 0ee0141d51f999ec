package policy

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/quotaplane/quotaplane/api/v1alpha1"
)

// DefaultNamespace is the namespace of objects in files that name none.
const DefaultNamespace = "default"

// maxFileBytes bounds one file read by LoadDir.
const maxFileBytes = 16 << 20

// LoadDir reads every *.yaml, *.yml and *.json file directly in dir (hidden
// entries, such as the ..data links of a mounted ConfigMap, are skipped),
// decodes the quotaplane.io objects in them (and v1 Secrets, which
// TenantQuotas may name for their api keys) and compiles them. Documents of
// other API groups (a kustomization, say) are ignored. Any problem, in a file
// or in the compiled objects, is an error that lists them all.
func LoadDir(dir string) (*Policy, error) {
	objs, err := ReadDir(dir)
	if err != nil {
		return nil, err
	}
	p, err := compileAll(objs)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", dir, err)
	}
	return p, nil
}

// compileAll compiles objs and turns any problem into an error listing all.
func compileAll(objs []runtime.Object) (*Policy, error) {
	p, problems := Compile(objs)
	if len(problems) > 0 {
		errs := make([]error, len(problems))
		for i, pr := range problems {
			errs[i] = pr
		}
		return nil, fmt.Errorf("%d problem(s):\n%w", len(problems), errors.Join(errs...))
	}
	return p, nil
}

// ReadDir decodes the quotaplane.io objects in the files of dir, in file name
// order; see LoadDir.
func ReadDir(dir string) ([]runtime.Object, error) {
	objs, err := ReadFS(os.DirFS(dir))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", dir, err)
	}
	return objs, nil
}

// LoadFS is LoadDir over the top directory of a file system, such as the
// embedded samples.
func LoadFS(fsys fs.FS) (*Policy, error) {
	objs, err := ReadFS(fsys)
	if err != nil {
		return nil, err
	}
	return compileAll(objs)
}

// ReadFS decodes the quotaplane.io objects in the files at the top of fsys,
// in file name order; see LoadDir.
func ReadFS(fsys fs.FS) ([]runtime.Object, error) {
	entries, err := fs.ReadDir(fsys, ".")
	if err != nil {
		return nil, fmt.Errorf("read policy directory: %w", err)
	}
	var objs []runtime.Object
	var errs []error
	for _, e := range entries {
		name := e.Name()
		if strings.HasPrefix(name, ".") || !slices.Contains([]string{".yaml", ".yml", ".json"}, filepath.Ext(name)) {
			continue
		}
		if info, err := fs.Stat(fsys, name); err != nil || info.IsDir() {
			continue // a dangling link mid-swap, or a directory
		}
		data, err := readFile(fsys, name)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		fileObjs, err := DecodeYAML(data)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", name, err))
			continue
		}
		objs = append(objs, fileObjs...)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return objs, nil
}

func readFile(fsys fs.FS, path string) ([]byte, error) {
	f, err := fsys.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(data) > maxFileBytes {
		return nil, fmt.Errorf("%s: larger than %d bytes", path, maxFileBytes)
	}
	return data, nil
}

// DecodeYAML decodes the quotaplane.io objects of a multi-document YAML (or
// JSON) stream. Unknown fields are errors, so a misspelt field is caught
// rather than silently ignored; objects without a namespace get DefaultNamespace.
func DecodeYAML(data []byte) ([]runtime.Object, error) {
	reader := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var objs []runtime.Object
	for doc := 1; ; doc++ {
		raw, err := reader.Read()
		if err == io.EOF {
			return objs, nil
		}
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", doc, err)
		}
		if len(bytes.TrimSpace(raw)) == 0 {
			continue
		}
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal(raw, &tm); err != nil {
			return nil, fmt.Errorf("document %d: %w", doc, err)
		}
		if tm.APIVersion == "" || tm.Kind == "" {
			if isEmptyDoc(raw) {
				continue
			}
			return nil, fmt.Errorf("document %d has no apiVersion or kind; quota objects start with apiVersion: %s and a kind", doc, v1alpha1.GroupVersion)
		}
		if tm.APIVersion == "v1" && tm.Kind == "Secret" {
			secret, err := decodeSecret(raw)
			if err != nil {
				return nil, fmt.Errorf("document %d (Secret): %w", doc, err)
			}
			objs = append(objs, secret)
			continue
		}
		if group, _, _ := strings.Cut(tm.APIVersion, "/"); group != v1alpha1.GroupVersion.Group {
			continue
		}
		if tm.APIVersion != v1alpha1.GroupVersion.String() {
			return nil, fmt.Errorf("document %d: apiVersion %q is not served; use %s", doc, tm.APIVersion, v1alpha1.GroupVersion)
		}
		var obj interface {
			runtime.Object
			metav1.Object
		}
		switch tm.Kind {
		case "QuotaPlane":
			obj = &v1alpha1.QuotaPlane{}
		case "TenantQuota":
			obj = &v1alpha1.TenantQuota{}
		case "EndpointQuota":
			obj = &v1alpha1.EndpointQuota{}
		case "BurstPool":
			obj = &v1alpha1.BurstPool{}
		case "Upstream":
			obj = &v1alpha1.Upstream{}
		default:
			return nil, fmt.Errorf("document %d: kind %q is not a quotaplane.io kind; use QuotaPlane, TenantQuota, EndpointQuota, BurstPool or Upstream", doc, tm.Kind)
		}
		if err := yaml.UnmarshalStrict(raw, obj); err != nil {
			return nil, fmt.Errorf("document %d (%s): %w", doc, tm.Kind, err)
		}
		if obj.GetName() == "" {
			return nil, fmt.Errorf("document %d (%s): metadata.name is required", doc, tm.Kind)
		}
		if obj.GetNamespace() == "" {
			obj.SetNamespace(DefaultNamespace)
		}
		objs = append(objs, obj)
	}
}

// decodeSecret decodes a v1 Secret, the api keys a TenantQuota's
// keySecretRef names, with its stringData folded into data as the API
// server does.
func decodeSecret(raw []byte) (*corev1.Secret, error) {
	var secret corev1.Secret
	if err := yaml.Unmarshal(raw, &secret); err != nil {
		return nil, err
	}
	if secret.Name == "" {
		return nil, fmt.Errorf("metadata.name is required")
	}
	if secret.Namespace == "" {
		secret.Namespace = DefaultNamespace
	}
	if len(secret.StringData) > 0 && secret.Data == nil {
		secret.Data = map[string][]byte{}
	}
	for k, v := range secret.StringData {
		secret.Data[k] = []byte(v)
	}
	secret.StringData = nil
	return &secret, nil
}

// isEmptyDoc reports whether a YAML document holds nothing but comments.
func isEmptyDoc(raw []byte) bool {
	var v any
	return yaml.Unmarshal(raw, &v) == nil && v == nil
}

// LoadPath compiles the quota objects at path: a directory (LoadDir) or
// one file of them (what `quotactl diff` and `simulate` accept).
func LoadPath(path string) (*Policy, error) {
	info, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if info.IsDir() {
		return LoadDir(path)
	}
	data, err := readFile(os.DirFS(filepath.Dir(path)), filepath.Base(path))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Dir(path), err)
	}
	objs, err := DecodeYAML(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	p, err := compileAll(objs)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return p, nil
}
