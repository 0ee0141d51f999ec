package whatif

import (
	"fmt"
	"os"

	"github.com/quotaplane/quotaplane/pkg/policy"
)

// Load compiles the quota objects at path: a directory (policy.LoadDir: its
// *.yaml, *.yml and *.json files) or one file. Any problem is an error that
// lists them all.
func Load(path string) (*policy.Policy, error) {
	info, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if info.IsDir() {
		return policy.LoadDir(path)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	objs, err := policy.DecodeYAML(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	p, problems := policy.Compile(objs)
	if len(problems) > 0 {
		msg := fmt.Sprintf("%s: %d problem(s):", path, len(problems))
		for _, pr := range problems {
			msg += "\n" + pr.String()
		}
		return nil, fmt.Errorf("%s", msg)
	}
	return p, nil
}
