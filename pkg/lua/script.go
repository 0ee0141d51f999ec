package lua

import (
	"context"
	"crypto/sha1"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"
)

//go:embed *.lua
var files embed.FS

// Script is one embedded script, called by its SHA-1. Every call recovers
// from NOSCRIPT (after SCRIPT FLUSH, a restart or a failover) by loading the
// script and calling it again by SHA; the script's source crosses the wire
// only then.
type Script struct {
	src string
	sha string
}

// load reads an embedded script with the shared files it uses composed in
// front of it, in order (after the script's shebang line, which must stay
// first): the SHA-1 is the composed text's. A missing file is a build
// mistake.
func load(name string, shared ...string) *Script {
	src := embedded(name)
	var head string
	if strings.HasPrefix(src, "#!") {
		line, rest, _ := strings.Cut(src, "\n")
		head, src = line+"\n", rest
	}
	var b strings.Builder
	b.WriteString(head)
	for _, s := range shared {
		b.WriteString(embedded(s))
		b.WriteString("\n")
	}
	b.WriteString(src)
	text := b.String()
	sum := sha1.Sum([]byte(text))
	return &Script{src: text, sha: hex.EncodeToString(sum[:])}
}

// embedded is the text of an embedded file.
func embedded(name string) string {
	b, err := files.ReadFile(name)
	if err != nil {
		panic(fmt.Sprintf("lua: %s is not embedded: %v", name, err))
	}
	return string(b)
}

// bucketLua is the code the scripts that keep levels share (bucket.lua).
const bucketLua = "bucket.lua"

// SHA is the script's SHA-1, as EVALSHA takes it.
func (s *Script) SHA() string { return s.sha }

// Load loads the script into c (on every master of a cluster).
func (s *Script) Load(ctx context.Context, c redis.Scripter) error {
	return c.ScriptLoad(ctx, s.src).Err()
}

// Run calls the script by SHA, loading it and calling again on NOSCRIPT.
func (s *Script) Run(ctx context.Context, c redis.Scripter, keys []string, args ...any) *redis.Cmd {
	cmd := c.EvalSha(ctx, s.sha, keys, args...)
	if !IsNoScript(cmd.Err()) {
		return cmd
	}
	if err := s.Load(ctx, c); err != nil {
		return cmd
	}
	return c.EvalSha(ctx, s.sha, keys, args...)
}

// Call is one call of a script in a pipeline.
type Call struct {
	Keys []string
	Args []any
	Cmd  *redis.Cmd // set by RunPipelined
}

// RunPipelined calls s once per call in one pipeline (one round trip per
// node of a cluster). Calls that fail with NOSCRIPT are run again in a second
// pipeline after loading the script; other errors stay in their Cmd. The
// returned error is the pipeline's own (a broken connection, a deadline);
// per-call errors are in each Call's Cmd.
func (s *Script) RunPipelined(ctx context.Context, c redis.UniversalClient, calls []Call) error {
	run := func(idx []int) error {
		_, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, i := range idx {
				calls[i].Cmd = p.EvalSha(ctx, s.sha, calls[i].Keys, calls[i].Args...)
			}
			return nil
		})
		return err
	}
	all := make([]int, len(calls))
	for i := range all {
		all[i] = i
	}
	err := run(all)
	var again []int
	for i := range calls {
		if IsNoScript(calls[i].Cmd.Err()) {
			again = append(again, i)
		}
	}
	if len(again) == 0 {
		return pipelineErr(err)
	}
	if lerr := s.Load(ctx, c); lerr != nil {
		return lerr
	}
	return pipelineErr(run(again))
}

// pipelineErr drops the error Pipelined returns for a command's own
// failure (a Redis reply error): those stay in the command.
func pipelineErr(err error) error {
	var reply redis.Error
	if errors.As(err, &reply) {
		return nil
	}
	return err
}

// IsNoScript reports whether err says the script is not loaded.
func IsNoScript(err error) bool {
	return err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT")
}
