package upstream

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/pkg/poll"
)

// TestNotifierSignsAndRetries: a receiver that fails twice gets the notice
// on the third attempt, signed with the secret.
func TestNotifierSignsAndRetries(t *testing.T) {
	var calls atomic.Int32
	got := make(chan string, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if calls.Add(1) < 3 {
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		if r.Header.Get(SignatureHeader) != Sign([]byte("s3cret"), body) {
			t.Errorf("signature %q does not match the body", r.Header.Get(SignatureHeader))
		}
		got <- string(body)
	}))
	defer srv.Close()
	n := NewNotifier(srv.URL, []byte("s3cret"), NotifierOptions{Backoff: 10 * time.Millisecond})
	defer n.Close()
	n.Notify(Notice{Plane: "ns/p", Upstream: "llm", Tenant: "acme", From: High, To: Medium, Phase: Phase1})
	select {
	case body := <-got:
		if want := `"tenant":"acme","from":"high","to":"medium"`; !strings.Contains(body, want) {
			t.Errorf("body %s lacks %s", body, want)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the notice never arrived")
	}
	poll.Until(t, 2*time.Second, "the notice to count as sent", func() bool { sent, _, _ := n.Stats(); return sent == 1 })
	if sent, dropped, failed := n.Stats(); sent != 1 || dropped != 0 || failed != 0 || calls.Load() != 3 {
		t.Errorf("sent %d dropped %d failed %d after %d calls, want 1 0 0 after 3", sent, dropped, failed, calls.Load())
	}
}

// TestNotifierBoundedQueue: a receiver that hangs holds one notice; the
// queue takes its bound and drops the rest, counted, and Close returns.
func TestNotifierBoundedQueue(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	defer close(release)
	n := NewNotifier(srv.URL, nil, NotifierOptions{Queue: 4, Attempts: 1, Timeout: 10 * time.Second})
	taken := 0
	for range 20 {
		if n.Notify(Notice{Tenant: "t"}) {
			taken++
		}
	}
	if _, dropped, _ := n.Stats(); taken > 5 || dropped != int64(20-taken) {
		t.Errorf("queue of 4 took %d of 20 and dropped %d", taken, dropped)
	}
	done := make(chan struct{})
	go func() { n.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(3 * time.Second):
		t.Fatal("Close waited for a hanging receiver")
	}
}
