package main

import (
	"bytes"
	"context"
	"encoding/json"
	"image/png"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/config/samples"
)

// chromiumBinary is headless Chromium: $QUOTAPLANE_CHROMIUM, else chromium
// on the PATH or Debian's /usr/bin/chromium (make chromium installs it).
// Without one the test skips, but fails when CI=true: CI must run it.
func chromiumBinary(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("QUOTAPLANE_CHROMIUM"); p != "" {
		return p
	}
	if p, err := exec.LookPath("chromium"); err == nil {
		return p
	}
	if _, err := os.Stat("/usr/bin/chromium"); err == nil {
		return "/usr/bin/chromium"
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("no chromium (QUOTAPLANE_CHROMIUM, PATH or /usr/bin/chromium): make chromium installs Debian's")
	}
	t.Skip("no chromium (QUOTAPLANE_CHROMIUM, PATH or /usr/bin/chromium): make chromium installs Debian's")
	return ""
}

// headless runs Chromium headless on url with the extra flags and returns
// its standard output; a fresh profile, no network beyond the page.
func headless(t *testing.T, chromium, url string, extra ...string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	args := append([]string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars",
		"--user-data-dir=" + t.TempDir()}, extra...)
	cmd := exec.CommandContext(ctx, chromium, append(args, url)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %s: %v\n%s", chromium, strings.Join(extra, " "), err, stderr.Bytes())
	}
	return stdout.Bytes()
}

// TestUIInChromium: a real enforcer on the sample plane decides a few
// requests; headless Chromium renders its /quota/ui with the numbers the
// enforcer's /readyz and /quota/debug give (policy version, a tenant's
// admitted and denied, the denials by level), a tenant's name as text
// (never as markup), and takes a 1280x900 screenshot.
func TestUIInChromium(t *testing.T) {
	chromium := chromiumBinary(t)
	dir := t.TempDir()
	entries, err := fs.ReadDir(samples.FS, ".")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		b, err := fs.ReadFile(samples.FS, e.Name())
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, e.Name()), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	p := startEnforcer(t, dir, "-node-id", "ui-node")

	const evil = `<i>evil</i>`
	send := func(tenant, endpoint string) {
		req, _ := http.NewRequest(http.MethodPost, "http://"+p.apiAddr+"/api/"+endpoint, nil)
		req.Header.Set("X-Tenant", tenant)
		req.Header.Set("X-Api-Key", "k1")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	for range 3 { // two exports pass, the third meets the free tier's tenant burst
		send("free-trial", "export")
	}
	for range 5 {
		send("acme", "read")
		send(evil, "read")
	}

	getJSON := func(path string, v any) {
		t.Helper()
		resp, err := http.Get("http://" + p.adminAddr + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %d", path, resp.StatusCode)
		}
		if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
			t.Fatal(err)
		}
	}
	var ready struct{ PolicyVersion int64 }
	getJSON("/readyz", &ready)
	type debug struct {
		Admitted int64
		Denied   map[string]int64
	}
	var trial, acme debug
	getJSON("/quota/debug?tenant=free-trial", &trial)
	getJSON("/quota/debug?tenant=acme", &acme)
	if trial.Admitted != 2 || trial.Denied["tenant"] != 1 || acme.Admitted != 5 {
		t.Fatalf("the enforcer's own view: free-trial %+v, acme %+v", trial, acme)
	}

	url := "http://" + p.adminAddr + "/quota/ui"
	start := time.Now()
	dom := string(headless(t, chromium, url, "--dump-dom"))
	t.Logf("chromium --dump-dom: %s, %d bytes", time.Since(start).Round(time.Millisecond), len(dom))
	row := func(attr, value string) string {
		t.Helper()
		m := regexp.MustCompile(`(?s)<tr class="[a-z]+" ` + attr + `="` + regexp.QuoteMeta(value) + `">(.*?)</tr>`).FindStringSubmatch(dom)
		if m == nil {
			t.Fatalf("the rendered page has no row %s=%q:\n%s", attr, value, dom)
		}
		return m[1]
	}
	cell := func(row, class string) string {
		t.Helper()
		m := regexp.MustCompile(`<td class="n ` + class + `">([^<]*)</td>`).FindStringSubmatch(row)
		if m == nil {
			t.Fatalf("no cell %q in %s", class, row)
		}
		return m[1]
	}
	if want := `id="policy-version">v` + strconv.FormatInt(ready.PolicyVersion, 10) + `<`; !strings.Contains(dom, want) {
		t.Errorf("the rendered page lacks %s", want)
	}
	for name, d := range map[string]debug{"free-trial": trial, "acme": acme} {
		r := row("data-tenant", name)
		if got, want := cell(r, "admitted"), strconv.FormatInt(d.Admitted, 10); got != want {
			t.Errorf("%s: admitted %s in the browser, %s by /quota/debug", name, got, want)
		}
		var denied int64
		for _, n := range d.Denied {
			denied += n
		}
		if got, want := cell(r, "denied"), strconv.FormatInt(denied, 10); got != want {
			t.Errorf("%s: denied %s in the browser, %s by /quota/debug", name, got, want)
		}
	}
	if got := cell(row("data-level", "tenant"), "count"); got != "1" {
		t.Errorf("denied at the tenant level: %s in the browser, 1 sent", got)
	}
	if got := cell(row("data-tier", "free"), "weight"); got != "1" {
		t.Errorf("free tier's weight %s in the browser; the sample's is 1", got)
	}
	// Its name cell holds text (serialized escaped), not an <i> element.
	if !regexp.MustCompile(`<td class="name" title="[^"]*">&lt;i&gt;evil&lt;/i&gt; `).MatchString(dom) {
		t.Errorf("the tenant %s is not rendered as text:\n%s", evil, dom)
	}

	shot := filepath.Join(t.TempDir(), "ui.png")
	start = time.Now()
	headless(t, chromium, url, "--window-size=1280,900", "--screenshot="+shot)
	t.Logf("chromium --screenshot: %s", time.Since(start).Round(time.Millisecond))
	f, err := os.Open(shot)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatal(err)
	}
	if b := img.Bounds(); b.Dx() != 1280 || b.Dy() != 900 {
		t.Errorf("screenshot %v, want 1280x900", b)
	}
	colors := map[uint32]bool{}
	for y := 0; y < img.Bounds().Dy(); y += 7 {
		for x := 0; x < img.Bounds().Dx(); x += 7 {
			r, g, b, _ := img.At(x, y).RGBA()
			colors[r>>8<<16|g>>8<<8|b>>8] = true
		}
	}
	if len(colors) < 20 {
		t.Errorf("the screenshot has %d colours: a blank or error page?", len(colors))
	}
}
