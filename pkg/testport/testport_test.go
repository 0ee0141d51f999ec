package testport

import (
	"net"
	"strconv"
	"testing"
)

// TestFreeIsBelowTheEphemeralRange: the port is free, and not one the
// kernel gives to outgoing connections.
func TestFreeIsBelowTheEphemeralRange(t *testing.T) {
	low := ephemeralLow()
	for range 20 {
		p := Free(t)
		if low-span >= 1024 && (p < low-span || p >= low) {
			t.Fatalf("port %d; want one in %d-%d", p, low-span, low-1)
		}
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil {
			t.Fatalf("port %d is not free: %v", p, err)
		}
		l.Close()
	}
}

// TestFreeNeverRepeats: tests running in parallel in one process never get
// the same port (500 picks from 12,000 ports would repeat one by chance
// with a probability above 99.99 %).
func TestFreeNeverRepeats(t *testing.T) {
	seen := map[int]bool{}
	for range 500 {
		p := Free(t)
		if seen[p] {
			t.Fatalf("port %d handed out twice", p)
		}
		seen[p] = true
	}
}
