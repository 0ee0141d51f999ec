// Package testport picks TCP ports on 127.0.0.1 for the real servers that
// tests start as processes (redis-server, enforcers, the manager,
// prometheus), which must be told their port before they listen.
//
// A port the kernel hands out for 127.0.0.1:0 comes from its ephemeral
// range, the same range every outgoing connection takes its local port
// from: between the pick and the server's bind, any connection of a test
// running beside it (make test runs three packages at once, several of
// them under HTTP load) may take it, and the server fails with "address
// already in use". So Free picks below the ephemeral range, where only
// servers bind, and checks that the port is free.
package testport

import (
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// span is how many ports below the ephemeral range Free picks from.
const span = 12000

// given are the ports Free handed out in this process: tests running in
// parallel each get ports of their own, not one another's, whose servers
// have not bound them yet.
var given struct {
	sync.Mutex
	ports map[int]bool
}

// Free returns a TCP port on 127.0.0.1 that no one listened on a moment
// ago and that Free did not hand out before in this process, below the
// kernel's ephemeral range.
func Free(t testing.TB) int {
	t.Helper()
	low := ephemeralLow()
	if low-span < 1024 {
		return kernelPort(t) // an unusual range: take the kernel's pick
	}
	for range 100 {
		p := low - span + rand.IntN(span)
		if l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p)); err == nil {
			l.Close()
			if take(p) {
				return p
			}
		}
	}
	t.Fatalf("testport: no free port in %d-%d", low-span, low-1)
	return 0
}

// ephemeralLow is the first port of the kernel's ephemeral range (Linux's
// default, 32768, where it cannot be read).
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	fields := strings.Fields(string(b))
	if len(fields) == 0 {
		return 32768
	}
	low, err := strconv.Atoi(fields[0])
	if err != nil {
		return 32768
	}
	return low
}

func kernelPort(t testing.TB) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("testport: no free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// take records p as handed out, unless it was already.
func take(p int) bool {
	given.Lock()
	defer given.Unlock()
	if given.ports[p] {
		return false
	}
	if given.ports == nil {
		given.ports = map[int]bool{}
	}
	given.ports[p] = true
	return true
}
