// Package envflag gives each command-line flag an environment twin
// (QUOTAPLANE_*): the environment sets the default, the flag wins. Containers
// configure the binaries with either.
package envflag

import (
	"log/slog"
	"os"
	"strconv"
	"time"
)

// String is the value of the environment variable name, or def when unset.
func String(name, def string) string {
	if v, ok := os.LookupEnv(name); ok {
		return v
	}
	return def
}

// Duration is the duration in name, or def when unset or unparsable (which is logged).
func Duration(name string, def time.Duration) time.Duration {
	if v, ok := os.LookupEnv(name); ok {
		if d, err := time.ParseDuration(v); err == nil {
			return d
		}
		slog.Warn("ignoring an unparsable duration", "env", name, "value", v)
	}
	return def
}

// Int is the integer in name, or def when unset or unparsable (which is logged).
func Int(name string, def int64) int64 {
	if v, ok := os.LookupEnv(name); ok {
		if n, err := strconv.ParseInt(v, 10, 64); err == nil {
			return n
		}
		slog.Warn("ignoring an unparsable number", "env", name, "value", v)
	}
	return def
}

// Bool is the boolean in name, or def when unset or unparsable (which is logged).
func Bool(name string, def bool) bool {
	if v, ok := os.LookupEnv(name); ok {
		if b, err := strconv.ParseBool(v); err == nil {
			return b
		}
		slog.Warn("ignoring an unparsable boolean", "env", name, "value", v)
	}
	return def
}
