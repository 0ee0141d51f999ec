package redistest

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"
)

// A failover, for real: StartReplica starts a replica of a server, Promote
// makes a replica a primary (REPLICAOF NO ONE, what Sentinel does) and
// ReplicaOf demotes a primary under another, after which it answers writes
// with READONLY. Clients that must follow the primary reach it through a
// Forwarder, moved when the failover is done.

// syncTimeout bounds how long a replica may take to sync with its primary.
const syncTimeout = 20 * time.Second

// StartReplica starts a redis-server that replicates primary (--replicaof,
// with primary's password as masterauth and as its own), and waits until
// its first sync is done; extra are more redis-server arguments. It is
// killed when the test ends.
func StartReplica(t testing.TB, primary *Server, extra ...string) *Server {
	t.Helper()
	primary.syncAtOnce()
	args := []string{"--replicaof", "127.0.0.1", strconv.Itoa(primary.port)}
	if primary.Password != "" {
		args = append(args, "--masterauth", primary.Password, "--requirepass", primary.Password)
	}
	s := Start(t, append(args, extra...)...)
	s.WaitSynced()
	return s
}

// Promote makes s a primary (REPLICAOF NO ONE): it keeps the data it had
// replicated and takes writes from now on. Writes its old primary takes
// later are not s's.
func (s *Server) Promote() {
	s.t.Helper()
	if err := s.Client().Do(context.Background(), "REPLICAOF", "NO", "ONE").Err(); err != nil {
		s.t.Fatalf("REPLICAOF NO ONE on %s: %v", s.Addr, err)
	}
}

// ReplicaOf makes s a replica of primary (REPLICAOF host port), at once:
// from now on s answers writes with READONLY, and once it has synced it
// holds primary's data, its own writes since they parted lost. It does not
// wait for the sync (WaitSynced does).
func (s *Server) ReplicaOf(primary *Server) {
	s.t.Helper()
	ctx := context.Background()
	primary.syncAtOnce()
	c := s.Client()
	if primary.Password != "" {
		if err := c.ConfigSet(ctx, "masterauth", primary.Password).Err(); err != nil {
			s.t.Fatalf("CONFIG SET masterauth on %s: %v", s.Addr, err)
		}
	}
	if err := c.Do(ctx, "REPLICAOF", "127.0.0.1", strconv.Itoa(primary.port)).Err(); err != nil {
		s.t.Fatalf("REPLICAOF %s on %s: %v", primary.Addr, s.Addr, err)
	}
}

// syncAtOnce makes s send a full sync to a replica at once rather than
// after the 5 s Redis waits by default for more replicas to share it.
func (s *Server) syncAtOnce() {
	s.t.Helper()
	if err := s.Client().ConfigSet(context.Background(), "repl-diskless-sync-delay", "0").Err(); err != nil {
		s.t.Fatalf("CONFIG SET repl-diskless-sync-delay on %s: %v", s.Addr, err)
	}
}

// WaitSynced waits until the replica s reports its link to its primary up
// and no sync in progress.
func (s *Server) WaitSynced() {
	s.t.Helper()
	c := s.Client()
	deadline := time.Now().Add(syncTimeout)
	for {
		info, err := c.Info(context.Background(), "replication").Result()
		if err == nil && strings.Contains(info, "master_link_status:up") && strings.Contains(info, "master_sync_in_progress:0") {
			return
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("replica %s not synced within %s: %v\n%s", s.Addr, syncTimeout, err, info)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// InfoField reads one field of INFO section from s ("" when absent), such
// as "errorstat_READONLY" of "errorstats" or "cmdstat_evalsha" of
// "commandstats".
func (s *Server) InfoField(section, field string) string {
	s.t.Helper()
	info, err := s.Client().Info(context.Background(), section).Result()
	if err != nil {
		s.t.Fatalf("INFO %s on %s: %v", section, s.Addr, err)
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			return v
		}
	}
	return ""
}

// InfoCount reads a count from an INFO field of the form "count=N,..." or
// "calls=N,..." (errorstats, commandstats), or a plain integer; 0 when the
// field is absent.
func (s *Server) InfoCount(section, field string) int64 {
	s.t.Helper()
	v := s.InfoField(section, field)
	if i := strings.IndexByte(v, '='); i >= 0 {
		v = v[i+1:]
		if j := strings.IndexByte(v, ','); j >= 0 {
			v = v[:j]
		}
	}
	n, _ := strconv.ParseInt(v, 10, 64)
	return n
}

// CPUMicros is the CPU the server has used, user and system, in µs (INFO
// cpu): unlike commandstats' times, which are wall times and grow while
// Redis waits for a core on a busy machine, it is what Redis spent,
// reading and parsing the calls and writing the replies included.
func (s *Server) CPUMicros() float64 {
	s.t.Helper()
	var sum float64
	for _, field := range []string{"used_cpu_sys", "used_cpu_user"} {
		v, err := strconv.ParseFloat(s.InfoField("cpu", field), 64)
		if err != nil {
			s.t.Fatalf("INFO cpu %s on %s: %v", field, s.Addr, err)
		}
		sum += v
	}
	return sum * 1e6
}
