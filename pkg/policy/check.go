package policy

import (
	"fmt"
	"io"
)

// Check compiles the quota objects of each directory in dirs, as the
// manager and the enforcer's file mode would, and writes every problem to
// w, one a line and prefixed with the directory, or a summary line of the
// compiled plane: the offline checker behind `enforcer check` and
// `quotactl check`. It reports whether every directory compiled without a
// problem.
func Check(w io.Writer, dirs ...string) bool {
	ok := true
	for _, dir := range dirs {
		objs, err := ReadDir(dir)
		if err != nil {
			fmt.Fprintln(w, err) // ReadDir's errors name dir

			ok = false
			continue
		}
		p, problems := Compile(objs)
		for _, pr := range problems {
			fmt.Fprintf(w, "%s: %s\n", dir, pr)
		}
		if len(problems) > 0 || p == nil {
			ok = false
			continue
		}
		s := p.Spec()
		fmt.Fprintf(w, "%s: ok: plane %s/%s, %d tiers, %d endpoints, %d tenants, burst pool: %t, hash %s\n",
			dir, s.Namespace, s.Plane, len(s.Tiers), len(s.Endpoints), len(s.Tenants), s.BurstPool != nil, p.Hash()[:12])
	}
	return ok
}
