package report_test

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/quotaplane/quotaplane/pkg/report"
)

type sample struct {
	Name string `json:"name"`
}

func (sample) Tables() []report.Table {
	return []report.Table{
		{Title: "first", Header: []string{"A", "LONGER B"}, Rows: [][]string{{"x|y", ""}, {"wide value", "2"}}, Notes: []string{"a note"}},
		{Title: "second", Notes: []string{"only notes"}},
	}
}

func TestWrite(t *testing.T) {
	var table, md, js bytes.Buffer
	for format, out := range map[string]*bytes.Buffer{"table": &table, "markdown": &md, "json": &js} {
		if err := report.Write(out, format, sample{Name: "s"}); err != nil {
			t.Fatalf("%s: %v", format, err)
		}
	}
	wantTable := "first\nA           LONGER B\nx|y         \nwide value  2\na note\n\nsecond\nonly notes\n"
	if table.String() != wantTable {
		t.Errorf("table:\n%q\nwant\n%q", table.String(), wantTable)
	}
	// Pipes are escaped and empty cells kept, so the columns hold.
	wantMD := "#### first\n\n| A | LONGER B |\n| --- | --- |\n| x\\|y |   |\n| wide value | 2 |\n\na note\n\n#### second\n\nonly notes\n"
	if md.String() != wantMD {
		t.Errorf("markdown:\n%q\nwant\n%q", md.String(), wantMD)
	}
	var back sample
	if err := json.Unmarshal(js.Bytes(), &back); err != nil || back.Name != "s" {
		t.Errorf("json: %s, %v", js.String(), err)
	}
	if err := report.Write(&js, "xml", sample{}); err == nil || !strings.Contains(err.Error(), "use table, json, markdown") {
		t.Errorf("format xml: %v", err)
	}
	if err := report.CheckFormat("yaml"); err == nil || report.CheckFormat("markdown") != nil {
		t.Errorf("CheckFormat: %v", err)
	}
}
