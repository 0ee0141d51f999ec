package poll

import (
	"runtime"
	"sync/atomic"
	"testing"
	"time"
)

// TestUntil: it returns once the condition holds, and fails a test whose
// condition never does, after the timeout.
func TestUntil(t *testing.T) {
	var n atomic.Int32
	Until(t, time.Second, "three polls", func() bool { return n.Add(1) >= 3 })
	if n.Load() != 3 {
		t.Fatalf("polled %d times, want 3", n.Load())
	}
	ft := &fakeT{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		Until(ft, 20*time.Millisecond, "never", func() bool { return false })
	}()
	<-done
	if !ft.failed.Load() || ft.msg == "" {
		t.Fatal("a condition that never holds did not fail the test")
	}
}

type fakeT struct {
	testing.TB
	failed atomic.Bool
	msg    string
}

func (f *fakeT) Helper()      {}
func (f *fakeT) Failed() bool { return f.failed.Load() }
func (f *fakeT) Fatalf(format string, args ...any) {
	f.msg = format
	f.failed.Store(true)
	runtime.Goexit()
}
