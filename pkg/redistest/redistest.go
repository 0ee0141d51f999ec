// Package redistest runs real redis-server processes for tests: one server
// or a small Redis Cluster, each on free loopback ports, stopped when the
// test ends. No mocks: everything that touches Redis is tested against the
// server Debian ships (`make test` installs it when it is missing).
//
// A server can be stopped and started again on the same port (a restart, or
// an outage of a chosen length) while clients keep their address. A server
// can have a replica and be failed over to it (replica.go), with clients on
// a Forwarder, the address that moves to the new primary (forward.go).
package redistest

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/pkg/testport"
	"github.com/redis/go-redis/v9"
)

func init() {
	// Servers are stopped on purpose here; the client's log of failed
	// dials is noise in test output.
	redis.SetLogger(quiet{})
}

type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}

// startTimeout bounds how long a server may take to answer PING.
const startTimeout = 10 * time.Second

// Server is one redis-server process on 127.0.0.1.
type Server struct {
	t    testing.TB
	Addr string
	// Password is the one "--requirepass" set (clients of Client use it).
	Password string
	port     int
	dir      string
	args     []string
	tls      *TLS // nil: plain text

	mu  sync.Mutex
	cmd *exec.Cmd
}

// Start starts a redis-server on a free loopback port with persistence off;
// extra are more redis-server arguments ("--maxmemory", "10mb", ...). The
// server is killed when the test ends.
func Start(t testing.TB, extra ...string) *Server {
	t.Helper()
	return start(t, nil, extra...)
}

// TLS is how StartTLS serves: PEM files, and whether clients must present a
// certificate.
type TLS struct {
	CertFile, KeyFile string
	// CAFile holds the CAs of client certificates (tls-ca-cert-file).
	CAFile string
	// AuthClients: clients must present a certificate of CAFile
	// (tls-auth-clients yes).
	AuthClients bool
	// Client is how the readiness check and Server.Client connect.
	Client *tls.Config
}

// StartTLS is Start for a server that speaks only TLS (--port 0 and
// --tls-port on the free port); Debian's redis-server is built with TLS.
func StartTLS(t testing.TB, cfg TLS, extra ...string) *Server {
	t.Helper()
	return start(t, &cfg, extra...)
}

func start(t testing.TB, tlsCfg *TLS, extra ...string) *Server {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatalf("redis-server is not installed: `make test` installs it (apt-get install redis-server): %v", err)
	}
	s := &Server{t: t, dir: t.TempDir(), tls: tlsCfg}
	for i, a := range extra {
		if a == "--requirepass" && i+1 < len(extra) {
			s.Password = extra[i+1]
		}
	}
	for attempt := 0; ; attempt++ {
		s.port = freePort(t)
		s.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port))
		s.args = []string{"--port", strconv.Itoa(s.port)}
		if tlsCfg != nil {
			authClients := "no"
			if tlsCfg.AuthClients {
				authClients = "yes"
			}
			s.args = []string{"--port", "0", "--tls-port", strconv.Itoa(s.port), "--tls-cert-file", tlsCfg.CertFile,
				"--tls-key-file", tlsCfg.KeyFile, "--tls-ca-cert-file", tlsCfg.CAFile, "--tls-auth-clients", authClients}
		}
		s.args = append(append(s.args, "--bind", "127.0.0.1",
			"--save", "", "--appendonly", "no", "--dir", s.dir, "--logfile", filepath.Join(s.dir, "redis.log")), extra...)
		err = s.startBin(bin)
		if err == nil || attempt == 4 {
			break
		}
	}
	if err != nil {
		t.Fatalf("redis-server: %v", err)
	}
	t.Cleanup(s.Stop)
	return s
}

func freePort(t testing.TB) int { return testport.Free(t) }

func (s *Server) startBin(bin string) error {
	cmd := exec.Command(bin, s.args...)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	opts := &redis.Options{Addr: s.Addr, Password: s.Password, MaxRetries: -1, DialTimeout: 200 * time.Millisecond}
	if s.tls != nil {
		opts.TLSConfig = s.tls.Client
	}
	c := redis.NewClient(opts)
	defer c.Close()
	deadline := time.Now().Add(startTimeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			s.mu.Lock()
			s.cmd = cmd
			s.mu.Unlock()
			go func() { <-exited }() // reaped by the goroutine above
			return nil
		}
		select {
		case werr := <-exited:
			log, _ := os.ReadFile(filepath.Join(s.dir, "redis.log"))
			return fmt.Errorf("exited (%v) before answering on %s: %s", werr, s.Addr, lastLines(string(log), 5))
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			return fmt.Errorf("no answer on %s within %s: %v", s.Addr, startTimeout, err)
		}
	}
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// Stop kills the server (SIGKILL: nothing is saved, clients see the
// connection drop). Stopping a stopped server does nothing.
func (s *Server) Stop() {
	s.mu.Lock()
	cmd := s.cmd
	s.cmd = nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Kill()
	// Wait until the port is free, so that a restart can bind it.
	for i := 0; i < 200; i++ {
		c, err := net.DialTimeout("tcp", s.Addr, 50*time.Millisecond)
		if err != nil {
			return
		}
		c.Close()
		time.Sleep(5 * time.Millisecond)
	}
}

// Restart starts a stopped server again on the same port, empty (nothing
// was persisted): scripts and keys are gone, as after a crash.
func (s *Server) Restart() {
	s.t.Helper()
	s.Stop()
	bin, _ := exec.LookPath("redis-server")
	var err error
	for attempt := 0; attempt < 50; attempt++ { // the port may linger briefly
		if err = s.startBin(bin); err == nil {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	s.t.Fatalf("restart redis-server on %s: %v", s.Addr, err)
}

// Client returns a client of the server, closed when the test ends. Its
// commands honour their contexts' deadlines (ContextTimeoutEnabled), as the
// enforcer's client must.
func (s *Server) Client() *redis.Client {
	opts := &redis.Options{Addr: s.Addr, Password: s.Password, ContextTimeoutEnabled: true}
	if s.tls != nil {
		opts.TLSConfig = s.tls.Client
	}
	c := redis.NewClient(opts)
	s.t.Cleanup(func() { _ = c.Close() })
	return c
}

// Cluster is a Redis Cluster of masters without replicas, every slot
// assigned, on loopback ports.
type Cluster struct {
	Nodes []*Server
}

// StartCluster starts n cluster-enabled servers, splits the 16384 slots
// evenly among them and waits until every node reports the cluster ok.
func StartCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	c := &Cluster{}
	for i := 0; i < n; i++ {
		c.Nodes = append(c.Nodes, Start(t, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", "2000"))
	}
	ctx := context.Background()
	const slots = 16384
	for i, s := range c.Nodes {
		cl := s.Client()
		lo, hi := i*slots/n, (i+1)*slots/n-1
		if err := cl.ClusterAddSlotsRange(ctx, lo, hi).Err(); err != nil {
			t.Fatalf("cluster addslots on %s: %v", s.Addr, err)
		}
		if i > 0 {
			if err := cl.ClusterMeet(ctx, "127.0.0.1", strconv.Itoa(c.Nodes[0].port)).Err(); err != nil {
				t.Fatalf("cluster meet: %v", err)
			}
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for _, s := range c.Nodes {
		cl := s.Client()
		for {
			info, err := cl.ClusterInfo(ctx).Result()
			if err == nil && strings.Contains(info, "cluster_state:ok") && strings.Contains(info, fmt.Sprintf("cluster_known_nodes:%d", n)) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("cluster not ok within 30s on %s: %v %s", s.Addr, err, info)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return c
}

// Client returns a cluster client, closed when the test ends.
func (c *Cluster) Client(t testing.TB) *redis.ClusterClient {
	addrs := make([]string, len(c.Nodes))
	for i, s := range c.Nodes {
		addrs[i] = s.Addr
	}
	cl := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = cl.Close() })
	return cl
}
