// Package logging sets up the logs of both binaries, the enforcer and the
// manager, one way: log/slog, structured, to stderr, as logfmt-like text
// (the default, for people) or JSON (for log pipelines), chosen by
// -log-format (QUOTAPLANE_LOG_FORMAT), at the level of -log-level
// (QUOTAPLANE_LOG_LEVEL).
//
// The manager's controller-runtime logs through logr: it gets the same
// slog handler through logr.FromSlogHandler (ctrl.SetLogger), so its
// reconcilers' lines and the manager's own share one format and one level,
// rather than a zap logger beside slog. A logr V(n) line is slog level
// -n: -log-level=debug shows V(1) and V(4) lines too (slog.LevelDebug is
// -4).
package logging

import (
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"

	"github.com/quotaplane/quotaplane/pkg/envflag"
)

// Formats are the values of -log-format.
var Formats = []string{"text", "json"}

// Options are the logging flags' values.
type Options struct {
	Format string
	Level  string
}

// Register defines -log-format and -log-level on fs.
func Register(fs *flag.FlagSet) *Options {
	o := &Options{}
	fs.StringVar(&o.Format, "log-format", envflag.String("QUOTAPLANE_LOG_FORMAT", "text"), "log format: text or json [QUOTAPLANE_LOG_FORMAT]")
	fs.StringVar(&o.Level, "log-level", envflag.String("QUOTAPLANE_LOG_LEVEL", "info"), "least level logged: debug, info, warn or error [QUOTAPLANE_LOG_LEVEL]")
	return o
}

// Handler is the slog handler the options ask for, writing to w; a format
// or level it does not know is an error that names the choices.
func (o *Options) Handler(w io.Writer) (slog.Handler, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(o.Level)); err != nil {
		return nil, fmt.Errorf("-log-level %q: use debug, info, warn or error", o.Level)
	}
	opts := &slog.HandlerOptions{Level: level}
	switch strings.ToLower(o.Format) {
	case "text":
		return slog.NewTextHandler(w, opts), nil
	case "json":
		return slog.NewJSONHandler(w, opts), nil
	}
	return nil, fmt.Errorf("-log-format %q: use %s", o.Format, strings.Join(Formats, " or "))
}

// Setup makes the options' handler, writing to w, slog's default and
// returns its logger.
func (o *Options) Setup(w io.Writer) (*slog.Logger, error) {
	h, err := o.Handler(w)
	if err != nil {
		return nil, err
	}
	log := slog.New(h)
	slog.SetDefault(log)
	return log, nil
}
