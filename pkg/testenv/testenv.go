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
	"fmt"
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
func Assets() (string, error) {
	if dir := os.Getenv("KUBEBUILDER_ASSETS"); dir != "" {
		return dir, nil
	}
	var out, errOut bytes.Buffer
	cmd := exec.Command("bash", filepath.Join(Root(), "hack", "envtest-binaries.sh"))
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("hack/envtest-binaries.sh: %w\n%s", err, errOut.String())
	}
	return strings.TrimSpace(out.String()), nil
}

// Launch starts an API server with quotaplane's CRDs; Stop stops it. Tests
// use Start; Launch is for a TestMain that shares one server.
func Launch() (*Env, error) {
	assets, err := Assets()
	if err != nil {
		return nil, err
	}
	e := &envtest.Environment{
		BinaryAssetsDirectory:    assets,
		CRDDirectoryPaths:        []string{filepath.Join(Root(), "config", "crd", "bases")},
		ErrorIfCRDPathMissing:    true,
		Scheme:                   Scheme(),
		ControlPlaneStartTimeout: time.Minute,
		ControlPlaneStopTimeout:  time.Minute,
	}
	cfg, err := e.Start()
	if err != nil {
		return nil, fmt.Errorf("start the test API server: %w", err)
	}
	c, err := client.New(cfg, client.Options{Scheme: e.Scheme})
	if err != nil {
		_ = e.Stop()
		return nil, fmt.Errorf("client: %w", err)
	}
	return &Env{Environment: e, Config: cfg, Client: c}, nil
}

// Start starts an API server with quotaplane's CRDs, stopped when the test ends.
func Start(t testing.TB) *Env {
	t.Helper()
	e, err := Launch()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := e.Stop(); err != nil {
			t.Errorf("stop the test API server: %v", err)
		}
	})
	return e
}
