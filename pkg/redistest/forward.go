package redistest

import (
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
)

// Forwarder is a loopback address that forwards each TCP connection to a
// server, and can be moved to another: the name clients keep through a
// failover (a Service, a DNS name, a virtual IP) while the server behind
// it changes. A connection made before a move stays with the server it
// reached, as it does behind a Service; a client leaves a demoted primary
// when it answers READONLY (go-redis then closes the connection and dials
// again).
type Forwarder struct {
	Addr string

	l      net.Listener
	target atomic.Pointer[string]
	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	wg     sync.WaitGroup
}

// Forward listens on a free loopback port and forwards to the address to
// (host:port) until the test ends.
func Forward(t testing.TB, to string) *Forwarder {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("forwarder: %v", err)
	}
	f := &Forwarder{Addr: l.Addr().String(), l: l, conns: map[net.Conn]struct{}{}}
	f.MoveTo(to)
	f.wg.Add(1)
	go f.accept()
	t.Cleanup(f.close)
	return f
}

// MoveTo sends the connections made from now on to addr.
func (f *Forwarder) MoveTo(addr string) { f.target.Store(&addr) }

func (f *Forwarder) accept() {
	defer f.wg.Done()
	for {
		in, err := f.l.Accept()
		if err != nil {
			return // closed
		}
		out, err := net.Dial("tcp", *f.target.Load())
		if err != nil {
			in.Close()
			continue
		}
		if !f.track(in, out) {
			return
		}
		f.wg.Add(2)
		go f.pipe(in, out)
		go f.pipe(out, in)
	}
}

// track records a pair of connections, unless the forwarder is closing.
func (f *Forwarder) track(cs ...net.Conn) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.conns == nil {
		for _, c := range cs {
			c.Close()
		}
		return false
	}
	for _, c := range cs {
		f.conns[c] = struct{}{}
	}
	return true
}

// pipe copies from one connection to the other; when either side ends,
// both are closed, as a proxy's would be.
func (f *Forwarder) pipe(from, to net.Conn) {
	defer f.wg.Done()
	_, _ = io.Copy(to, from)
	from.Close()
	to.Close()
	f.mu.Lock()
	if f.conns != nil {
		delete(f.conns, from)
		delete(f.conns, to)
	}
	f.mu.Unlock()
}

func (f *Forwarder) close() {
	f.l.Close()
	f.mu.Lock()
	for c := range f.conns {
		c.Close()
	}
	f.conns = nil
	f.mu.Unlock()
	f.wg.Wait()
}
