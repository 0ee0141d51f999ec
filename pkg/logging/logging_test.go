package logging

import (
	"bytes"
	"encoding/json"
	"flag"
	"strings"
	"testing"

	"github.com/go-logr/logr"
)

// TestFormats: json writes one JSON object a line, text key=value pairs;
// the level filters; the logr bridge (the manager's controller-runtime)
// writes through the same handler.
func TestFormats(t *testing.T) {
	for _, format := range Formats {
		fs := flag.NewFlagSet("test", flag.ContinueOnError)
		o := Register(fs)
		if err := fs.Parse([]string{"-log-format", format, "-log-level", "warn"}); err != nil {
			t.Fatal(err)
		}
		var buf bytes.Buffer
		log, err := o.Setup(&buf)
		if err != nil {
			t.Fatal(err)
		}
		log.Info("hidden")
		log.Warn("shown", "plane", "ns/main")
		logr.FromSlogHandler(log.Handler()).Error(nil, "from logr", "controller", "compiler")
		lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
		if len(lines) != 2 || strings.Contains(buf.String(), "hidden") {
			t.Fatalf("%s: want the warning and the logr error, got:\n%s", format, buf.String())
		}
		for _, line := range lines {
			var v map[string]any
			isJSON := json.Unmarshal([]byte(line), &v) == nil
			if isJSON != (format == "json") {
				t.Errorf("%s: line %q (JSON: %t)", format, line, isJSON)
			}
		}
		if !strings.Contains(lines[0], "ns/main") || !strings.Contains(lines[1], "compiler") {
			t.Errorf("%s: attributes missing:\n%s", format, buf.String())
		}
	}
}

func TestBadFlags(t *testing.T) {
	for _, o := range []Options{{Format: "xml", Level: "info"}, {Format: "json", Level: "loud"}} {
		if _, err := o.Handler(&bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), "use") {
			t.Errorf("%+v: %v; want an error naming the choices", o, err)
		}
	}
}
