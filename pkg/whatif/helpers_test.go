package whatif_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/config/samples"
	"github.com/quotaplane/quotaplane/pkg/enforcer"
	"github.com/quotaplane/quotaplane/pkg/load"
)

// edit replaces Old with New in one file of the sample plane.
type edit struct{ File, Old, New string }

// halveFree halves the free tier's tenant limit (rate and burst).
var halveFree = edit{"quotaplane.yaml", "tenant: {rate: 50, burst: 100}", "tenant: {rate: 25, burst: 50}"}

// samplesWith writes the sample plane (config/samples) with edits into a
// new directory and returns it; an edit whose Old is not in its file, once,
// fails the test, so the samples cannot drift away from what it changes.
func samplesWith(t *testing.T, edits ...edit) string {
	t.Helper()
	dir := t.TempDir()
	files := map[string]string{}
	err := fs.WalkDir(samples.FS, ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := fs.ReadFile(samples.FS, path)
		files[path] = string(data)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range edits {
		if n := strings.Count(files[e.File], e.Old); n != 1 {
			t.Fatalf("config/samples/%s holds %q %d times, want once: update the test's edit", e.File, e.Old, n)
		}
		files[e.File] = strings.Replace(files[e.File], e.Old, e.New, 1)
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// enforcerClock pins the engine's clock where load's virtual time starts,
// as cmd/load -virtual does.
func enforcerClock() enforcer.Option {
	return enforcer.WithClock(func() time.Time { return load.Epoch })
}

func writeFile(t *testing.T, path, data string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}
