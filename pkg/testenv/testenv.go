// Package testenv starts a real Kubernetes API server (kube-apiserver and
// etcd, through controller-runtime's envtest) with quotaplane's CRDs
// installed, for controller and end-to-end tests. No fake clients.
//
// The binaries come from KUBEBUILDER_ASSETS when it is set, otherwise from
// hack/envtest-binaries.sh, which builds them from Go modules once and caches
// them outside the repository (`make test` runs it before the tests, so
// parallel test packages never build at the same time).
package testenv

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/quotaplane/quotaplane/api/v1alpha1"
)

// Env is a running API server with the CRDs installed.
type Env struct {
	*envtest.Environment
	Config *rest.Config
	Client client.Client // an uncached client with Scheme
}

// Root is the repository's root directory.
func Root() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// Scheme knows the built-in kinds and quotaplane.io/v1alpha1.
func Scheme() *k8sruntime.Scheme {
	s := k8sruntime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		panic(err)
	}
	if err := v1alpha1.AddToScheme(s); err != nil {
		panic(err)
	}
	return s
}

// Assets is the directory holding kube-apiserver and etcd.
func Assets(t testing.TB) string {
	t.Helper()
	if dir := os.Getenv("KUBEBUILDER_ASSETS"); dir != "" {
		return dir
	}
	var out, errOut bytes.Buffer
	cmd := exec.Command("bash", filepath.Join(Root(), "hack", "envtest-binaries.sh"))
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		t.Fatalf("hack/envtest-binaries.sh: %v\n%s", err, errOut.String())
	}
	return strings.TrimSpace(out.String())
}

// Start starts an API server with quotaplane's CRDs, stopped when the test ends.
func Start(t testing.TB) *Env {
	t.Helper()
	e := &envtest.Environment{
		BinaryAssetsDirectory:    Assets(t),
		CRDDirectoryPaths:        []string{filepath.Join(Root(), "config", "crd", "bases")},
		ErrorIfCRDPathMissing:    true,
		Scheme:                   Scheme(),
		ControlPlaneStartTimeout: time.Minute,
		ControlPlaneStopTimeout:  time.Minute,
	}
	cfg, err := e.Start()
	if err != nil {
		t.Fatalf("start the test API server: %v", err)
	}
	t.Cleanup(func() {
		if err := e.Stop(); err != nil {
			t.Errorf("stop the test API server: %v", err)
		}
	})
	c, err := client.New(cfg, client.Options{Scheme: e.Scheme})
	if err != nil {
		t.Fatalf("client: %v", err)
	}
	return &Env{Environment: e, Config: cfg, Client: c}
}
