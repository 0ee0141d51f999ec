// Package report prints an operator's report three ways: aligned text tables
// for a terminal, JSON for scripts, and GitHub-flavoured Markdown tables
// for a pull request comment (quotactl's -o table|json|markdown). A
// report gives its tables for people (Tables) and is its own JSON.
package report

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
)

// Formats are the output formats Write knows.
var Formats = []string{"table", "json", "markdown"}

// Table is one table of a report as people read it.
type Table struct {
	Title  string
	Header []string
	Rows   [][]string
	// Notes are lines printed under the table.
	Notes []string
}

// Report is what Write prints: tables for people, itself for JSON.
type Report interface {
	Tables() []Table
}

// Write prints r to w in format (Formats): aligned text tables, the
// report's JSON, or GitHub-flavoured Markdown tables for a pull request.
func Write(w io.Writer, format string, r Report) error {
	switch format {
	case "json":
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(r)
	case "table", "":
		for i, t := range r.Tables() {
			if i > 0 {
				fmt.Fprintln(w)
			}
			if t.Title != "" {
				fmt.Fprintln(w, t.Title)
			}
			if len(t.Header) > 0 {
				tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
				fmt.Fprintln(tw, strings.Join(t.Header, "\t"))
				for _, row := range t.Rows {
					fmt.Fprintln(tw, strings.Join(row, "\t"))
				}
				if err := tw.Flush(); err != nil {
					return err
				}
			}
			for _, n := range t.Notes {
				fmt.Fprintln(w, n)
			}
		}
		return nil
	case "markdown":
		for i, t := range r.Tables() {
			if i > 0 {
				fmt.Fprintln(w)
			}
			if t.Title != "" {
				fmt.Fprintf(w, "#### %s\n\n", t.Title)
			}
			if len(t.Header) > 0 {
				fmt.Fprintf(w, "| %s |\n", strings.Join(mdCells(t.Header), " | "))
				fmt.Fprintf(w, "|%s\n", strings.Repeat(" --- |", len(t.Header)))
				for _, row := range t.Rows {
					fmt.Fprintf(w, "| %s |\n", strings.Join(mdCells(row), " | "))
				}
			}
			if len(t.Notes) > 0 {
				if len(t.Header) > 0 {
					fmt.Fprintln(w)
				}
				for _, n := range t.Notes {
					fmt.Fprintf(w, "%s\n", n)
				}
			}
		}
		return nil
	}
	return fmt.Errorf("output format %q: use %s", format, strings.Join(Formats, ", "))
}

// CheckFormat says whether format is one Write knows, as an error a user
// can act on.
func CheckFormat(format string) error {
	if slices.Contains(Formats, format) {
		return nil
	}
	return fmt.Errorf("-o %q: use %s", format, strings.Join(Formats, ", "))
}

// mdCells escapes the cells of a Markdown table row.
func mdCells(cells []string) []string {
	out := make([]string, len(cells))
	for i, c := range cells {
		c = strings.ReplaceAll(c, "|", `\|`)
		if c == "" {
			c = " "
		}
		out[i] = c
	}
	return out
}
