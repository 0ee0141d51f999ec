package enforcer

import (
	"sync"
	"sync/atomic"
	"time"
)

// coarseClock is a clock read with one atomic load: a goroutine advances it
// every resolution. Reading the system clock costs about 100 ns on the VMs
// this runs on, more than a whole decision; a millisecond of staleness costs
// a bucket at most a millisecond of refill. Its time comes from the monotonic
// clock, so wall-clock steps do not move it.
type coarseClock struct {
	nowUs      atomic.Int64
	resolution time.Duration
	start      sync.Once
	stop       chan struct{}
	done       chan struct{}
}

func newCoarseClock(resolution time.Duration) *coarseClock {
	return &coarseClock{resolution: resolution, stop: make(chan struct{}), done: make(chan struct{})}
}

// now returns µs since the Unix epoch; the ticking goroutine starts on first use.
func (c *coarseClock) now() int64 {
	c.start.Do(c.run)
	return c.nowUs.Load()
}

func (c *coarseClock) run() {
	base := time.Now()
	baseUs := base.UnixMicro()
	c.nowUs.Store(baseUs)
	go func() {
		defer close(c.done)
		t := time.NewTicker(c.resolution)
		defer t.Stop()
		for {
			select {
			case <-c.stop:
				return
			case <-t.C:
				c.nowUs.Store(baseUs + time.Since(base).Microseconds())
			}
		}
	}()
}

// close stops the goroutine if it was started.
func (c *coarseClock) close() {
	started := true
	c.start.Do(func() { started = false })
	close(c.stop)
	if started {
		<-c.done
	}
}
