// Package policytest compiles quota objects written as YAML for tests: one
// helper for every package's tests, failing the test on any problem.
package policytest

import (
	"testing"

	"github.com/quotaplane/quotaplane/pkg/policy"
)

// Compile decodes doc (quota objects as YAML, "---" between them) and
// compiles it; a decoding error or any problem fails t.
func Compile(t testing.TB, doc string) *policy.Policy {
	t.Helper()
	objs, err := policy.DecodeYAML([]byte(doc))
	if err != nil {
		t.Fatalf("decode the test's quota objects: %v", err)
	}
	p, problems := policy.Compile(objs)
	if len(problems) > 0 || p == nil {
		t.Fatalf("the test's quota objects do not compile: %v", problems)
	}
	return p
}
