package upstream

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// Notice is what the class-change webhook receives: seed 004's "proactive
// communication" when a tenant's class changes, as one JSON object per
// POST.
type Notice struct {
	Plane    string `json:"plane"`
	Upstream string `json:"upstream"`
	Tenant   string `json:"tenant"`
	From     Class  `json:"from"`
	To       Class  `json:"to"`
	// Score and Confidence are what the change came from; Phase is the
	// upstream's phase after the cycle.
	Score      float64   `json:"score"`
	Confidence float64   `json:"confidence"`
	Phase      Phase     `json:"phase"`
	At         time.Time `json:"at"`
}

// SignatureHeader carries the body's HMAC-SHA256 under the webhook's
// secret: "sha256=" and 64 hex digits, as GitHub's webhooks sign.
const SignatureHeader = "X-Quotaplane-Signature"

// Sign is the SignatureHeader value of body under secret.
func Sign(secret, body []byte) string {
	m := hmac.New(sha256.New, secret)
	m.Write(body)
	return "sha256=" + hex.EncodeToString(m.Sum(nil))
}

// Notifier posts notices to a webhook from a bounded queue, one at a time,
// each retried with backoff until it is taken (a 2xx) or its attempts are
// spent. A notice that finds the queue full is dropped and counted: a
// slow or dead receiver never holds a cycle up or grows memory.
type Notifier struct {
	url    string
	secret []byte
	client *http.Client
	queue  chan Notice
	// Attempts and Backoff bound the retries of one notice: Backoff,
	// doubling, between attempts.
	attempts int
	backoff  time.Duration

	sent, dropped, failed atomic.Int64
	stop                  chan struct{}
	done                  sync.WaitGroup
}

// NotifierOptions configure a Notifier; zero values take the defaults.
type NotifierOptions struct {
	Queue    int           // default 1024
	Attempts int           // default 4
	Backoff  time.Duration // default 1s
	Timeout  time.Duration // per attempt, default 5s
}

// NewNotifier starts a notifier posting to url, signing with secret (none
// when empty). Close stops it.
func NewNotifier(url string, secret []byte, o NotifierOptions) *Notifier {
	if o.Queue <= 0 {
		o.Queue = 1024
	}
	if o.Attempts <= 0 {
		o.Attempts = 4
	}
	if o.Backoff <= 0 {
		o.Backoff = time.Second
	}
	if o.Timeout <= 0 {
		o.Timeout = 5 * time.Second
	}
	n := &Notifier{url: url, secret: secret, client: &http.Client{Timeout: o.Timeout}, queue: make(chan Notice, o.Queue),
		attempts: o.Attempts, backoff: o.Backoff, stop: make(chan struct{})}
	n.done.Go(n.run)
	return n
}

// Notify queues a notice; false when the queue is full and it was dropped.
func (n *Notifier) Notify(x Notice) bool {
	select {
	case n.queue <- x:
		return true
	default:
		n.dropped.Add(1)
		return false
	}
}

// Stats counts the notices taken, dropped for a full queue, and given up
// after every attempt failed.
func (n *Notifier) Stats() (sent, dropped, failed int64) {
	return n.sent.Load(), n.dropped.Load(), n.failed.Load()
}

// Close stops the notifier; notices still queued are dropped.
func (n *Notifier) Close() {
	close(n.stop)
	n.done.Wait()
}

func (n *Notifier) run() {
	for {
		select {
		case <-n.stop:
			return
		case x := <-n.queue:
			if n.deliver(x) {
				n.sent.Add(1)
			} else {
				n.failed.Add(1)
			}
		}
	}
}

// deliver posts x until it is taken or the attempts are spent.
func (n *Notifier) deliver(x Notice) bool {
	body, err := json.Marshal(x)
	if err != nil {
		return false
	}
	wait := n.backoff
	for attempt := range n.attempts {
		if attempt > 0 {
			select {
			case <-n.stop:
				return false
			case <-time.After(wait):
			}
			wait *= 2
		}
		if n.post(body) == nil {
			return true
		}
	}
	return false
}

func (n *Notifier) post(body []byte) error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-n.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, n.url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	if len(n.secret) > 0 {
		req.Header.Set(SignatureHeader, Sign(n.secret, body))
	}
	resp, err := n.client.Do(req)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("webhook answered %s", resp.Status)
	}
	return nil
}
