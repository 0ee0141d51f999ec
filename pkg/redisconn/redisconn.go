// Package redisconn is how both binaries reach Redis: the same flags
// (address, ACL user, password from a file or the environment) build the
// same client, with the deadlines the engine relies on
// (ContextTimeoutEnabled). The password is never logged.
package redisconn

import (
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/quotaplane/quotaplane/pkg/envflag"
)

// Flags are a binary's Redis flags.
type Flags struct {
	Addr, Username, passwordFile *string
}

// Register adds -redis-addr (described by addrHelp), -redis-username and
// -redis-password-file to fs, each with its QUOTAPLANE_ twin.
func Register(fs *flag.FlagSet, addrHelp string) *Flags {
	return &Flags{
		Addr:     fs.String("redis-addr", envflag.String("QUOTAPLANE_REDIS_ADDR", ""), addrHelp+" [QUOTAPLANE_REDIS_ADDR]"),
		Username: fs.String("redis-username", envflag.String("QUOTAPLANE_REDIS_USERNAME", ""), "Redis ACL user [QUOTAPLANE_REDIS_USERNAME]"),
		passwordFile: fs.String("redis-password-file", envflag.String("QUOTAPLANE_REDIS_PASSWORD_FILE", ""),
			"file holding the Redis password, such as a mounted Secret (default: env QUOTAPLANE_REDIS_PASSWORD) [QUOTAPLANE_REDIS_PASSWORD_FILE]"),
	}
}

// Client returns a client of the Redis the flags name, and whether it
// sends a password (for logs).
func (f *Flags) Client() (c *redis.Client, hasPassword bool, err error) {
	password := os.Getenv("QUOTAPLANE_REDIS_PASSWORD")
	if *f.passwordFile != "" {
		b, err := os.ReadFile(*f.passwordFile)
		if err != nil {
			return nil, false, fmt.Errorf("read the Redis password (-redis-password-file): %w", err)
		}
		password = strings.TrimRight(string(b), "\r\n")
	}
	c = redis.NewClient(&redis.Options{Addr: *f.Addr, Username: *f.Username, Password: password, ContextTimeoutEnabled: true})
	return c, password != "", nil
}
