// Command quotactl answers operators' and reviewers' questions about a
// quota plane:
//
//	quotactl check DIR...                      compile quota objects offline, print every problem
//	quotactl diff OLD NEW                      what a policy change changes, level by level
//	quotactl simulate --policy NEW [--baseline OLD] --profile seed002|FILE
//	                                           replay a load in virtual time against both policies
//	quotactl explain TENANT --enforcer URL     why a tenant is throttled now (an enforcer's admin API)
//	quotactl status [--redis-addr ADDR] [--kubernetes]
//	                                           planes, published versions, fleet rollout
//
// Named kubectl-quota it is a kubectl plugin (`kubectl quota diff ...`);
// only its help text changes. Reports go to stdout as tables, or as JSON
// or Markdown with -o; errors go to stderr with a non-zero exit: 1 for a
// failure or a check that found problems, 2 for a usage error. The logic
// lives in packages (pkg/policy's Check, pkg/whatif, pkg/explain,
// pkg/planestatus, pkg/report; docs/quotactl.md); this file
// holds flags and wiring.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// errUsage marks an error that is the caller's mistake: exit code 2.
var errUsage = errors.New("usage")

// usageError is a usage mistake with its message.
func usageError(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errUsage, fmt.Sprintf(format, args...))
}

// errFound is a check or a status that found something wrong: exit 1, its
// report already printed.
var errFound = errors.New("found problems")

// command is one subcommand.
type command struct {
	name, args, summary string
	run                 func(ctx context.Context, env *env, args []string) error
}

// env is what a subcommand writes to and how it is called.
type env struct {
	prog           string // "quotactl" or "kubectl quota"
	stdout, stderr io.Writer
	cmd            *command // the command running
}

var commands = []command{
	{"check", "DIR...", "compile the quota objects of each directory and print every problem", runCheck},
	{"diff", "OLD NEW", "what changes from the policy at OLD to the one at NEW (directories or files), level by level", runDiff},
	{"simulate", "--policy NEW [--baseline OLD] --profile seed002|FILE", "replay a load profile in virtual time against the policies", runSimulate},
	{"explain", "TENANT --enforcer URL", "why a tenant is throttled now, from an enforcer's admin API", runExplain},
	{"status", "[--redis-addr ADDR] [--kubernetes] [--plane NS/NAME]", "planes, published versions, fleet rollout and degraded enforcers, from Redis and the Kubernetes API", runStatus},
}

// progName is how the user called the binary: "kubectl quota" when it is
// installed as the kubectl plugin kubectl-quota.
func progName(arg0 string) string {
	base := strings.TrimSuffix(filepath.Base(arg0), ".exe")
	if strings.HasPrefix(base, "kubectl-") {
		return "kubectl " + strings.ReplaceAll(strings.TrimPrefix(base, "kubectl-"), "_", "-")
	}
	return "quotactl"
}

func run(ctx context.Context, argv []string, stdout, stderr io.Writer) int {
	e := &env{prog: progName(argv[0]), stdout: stdout, stderr: stderr}
	if len(argv) < 2 {
		e.usage(stderr)
		return 2
	}
	name, args := argv[1], argv[2:]
	switch name {
	case "help", "-h", "-help", "--help":
		if len(args) > 0 {
			return run(ctx, []string{argv[0], args[0], "-h"}, stdout, stderr)
		}
		e.usage(stdout)
		return 0
	}
	for i := range commands {
		c := &commands[i]
		if c.name != name {
			continue
		}
		e.cmd = c
		err := c.run(ctx, e, args)
		switch {
		case err == nil:
			return 0
		case errors.Is(err, flag.ErrHelp):
			return 0
		case errors.Is(err, errFound):
			return 1
		case errors.Is(err, errUsage):
			fmt.Fprintf(stderr, "%s %s: %v\n", e.prog, name, strings.TrimPrefix(err.Error(), "usage: "))
			fmt.Fprintf(stderr, "run '%s %s -h' for its flags\n", e.prog, name)
			return 2
		default:
			fmt.Fprintf(stderr, "%s %s: %v\n", e.prog, name, err)
			return 1
		}
	}
	fmt.Fprintf(stderr, "%s: unknown command %q\n\n", e.prog, name)
	e.usage(stderr)
	return 2
}

func (e *env) usage(w io.Writer) {
	fmt.Fprintf(w, "%s: operate and review a quotaplane quota plane\n\nUsage:\n", e.prog)
	for _, c := range commands {
		fmt.Fprintf(w, "  %s %s %s\n      %s\n", e.prog, c.name, c.args, c.summary)
	}
	fmt.Fprintf(w, "  %s help [COMMAND]\n\nRun '%s COMMAND -h' for a command's flags.\n", e.prog, e.prog)
}

// flags returns the flag set of the running command, its usage naming the
// program as called; parse it with parse.
func (e *env) flags() *flag.FlagSet {
	c := e.cmd
	fs := flag.NewFlagSet(c.name, flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	fs.Usage = func() {
		fmt.Fprintf(e.stdout, "Usage: %s %s %s\n\n%s.\n", e.prog, c.name, c.args, c.summary)
		if hasFlags(fs) {
			fmt.Fprintln(e.stdout, "\nFlags:")
			fs.SetOutput(e.stdout)
			fs.PrintDefaults()
			fs.SetOutput(e.stderr)
		}
	}
	return fs
}

func hasFlags(fs *flag.FlagSet) bool {
	n := 0
	fs.VisitAll(func(*flag.Flag) { n++ })
	return n > 0
}

// parse parses args, flags and operands in any order (kubectl's habit:
// `explain acme --enforcer URL`), and returns the operands.
func parse(fs *flag.FlagSet, args []string) ([]string, error) {
	var operands []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, err
			}
			return nil, fmt.Errorf("%w: %v", errUsage, err)
		}
		args = fs.Args()
		if len(args) == 0 {
			return operands, nil
		}
		if args[0] == "--" {
			return append(operands, args[1:]...), nil
		}
		operands = append(operands, args[0])
		args = args[1:]
	}
}
