package upstream_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/pkg/upstream"
)

// server starts an httptest server with handler, closed when the test
// ends.
func server(t *testing.T, handler http.HandlerFunc) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(handler)
	t.Cleanup(srv.Close)
	return srv
}

// hang is a handler that answers nothing until the client gives up or the
// test ends (its context is canceled before the server's Close); before it
// hangs it runs first.
func hang(t *testing.T, first func(w http.ResponseWriter)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if first != nil {
			first(w)
		}
		select {
		case <-r.Context().Done():
		case <-t.Context().Done():
		}
	}
}

func TestProbeOK(t *testing.T) {
	srv := server(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("x-ratelimit-remaining-requests", "59")
		w.Header().Set("x-ratelimit-limit-requests", "60")
		io.WriteString(w, `{"data":[]}`)
	})
	p := &upstream.Prober{URL: srv.URL + "/v1/models"}
	before := time.Now()
	res := p.Probe(context.Background())
	s := res.Sample
	if s.Err || s.Status != 200 || res.Failure != "" || res.HeaderProblem != "" || res.Canceled {
		t.Fatalf("result %+v, want a 200 without failure", res)
	}
	if s.Remaining != 59 || s.Limit != 60 {
		t.Errorf("reading %d/%d, want 59/60", s.Remaining, s.Limit)
	}
	if s.Latency <= 0 || s.Latency > time.Since(before) || s.At.Before(before) {
		t.Errorf("latency %s at %v: want within the call", s.Latency, s.At)
	}
}

// TestProbeStatuses: an unexpected status is an error sample, and its
// rate-limit headers still count (a 429's empty window is the signal).
func TestProbeStatuses(t *testing.T) {
	var status atomic.Int32
	srv := server(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("x-ratelimit-remaining-requests", "0")
		w.Header().Set("x-ratelimit-limit-requests", "60")
		if status.Load() == http.StatusFound {
			w.Header().Set("Location", "/elsewhere")
		}
		w.WriteHeader(int(status.Load()))
	})
	for _, tc := range []struct {
		status   int
		expected []int
		err      bool
	}{
		{200, nil, false},
		{204, nil, false},
		{429, nil, true},
		{503, nil, true},
		{404, nil, true},
		{302, nil, true}, // not followed
		{404, []int{200, 404}, false},
		{200, []int{204}, true},
	} {
		status.Store(int32(tc.status))
		res := (&upstream.Prober{URL: srv.URL, Expected: tc.expected}).Probe(context.Background())
		if res.Sample.Err != tc.err || res.Sample.Status != tc.status || (res.Failure != "") != tc.err {
			t.Errorf("status %d, expected %v: %+v, want err %v", tc.status, tc.expected, res, tc.err)
		}
		if tc.err && !strings.Contains(res.Failure, "not expected") {
			t.Errorf("status %d: failure %q, want it not expected", tc.status, res.Failure)
		}
		if res.Sample.Remaining != 0 || res.Sample.Limit != 60 {
			t.Errorf("status %d: reading %d/%d, want 0/60", tc.status, res.Sample.Remaining, res.Sample.Limit)
		}
	}
}

// TestProbeHang: an upstream that never answers is an error sample whose
// latency is the timeout, and the probe returns at the timeout.
func TestProbeHang(t *testing.T) {
	srv := server(t, hang(t, nil))
	p := &upstream.Prober{URL: srv.URL, Timeout: 150 * time.Millisecond}
	start := time.Now()
	res := p.Probe(context.Background())
	took := time.Since(start)
	if !res.Sample.Err || res.Sample.Latency != 150*time.Millisecond || res.Canceled || !strings.Contains(res.Failure, "timed out after 150ms") {
		t.Errorf("result %+v, want an error of latency 150ms that timed out", res)
	}
	if took < 150*time.Millisecond || took > time.Second {
		t.Errorf("the probe took %s, want about its 150ms timeout", took)
	}
}

// TestProbeHangInBody: the timeout covers the body; the headers that came
// before the hang still count.
func TestProbeHangInBody(t *testing.T) {
	srv := server(t, hang(t, func(w http.ResponseWriter) {
		w.Header().Set("x-ratelimit-remaining-requests", "10")
		w.Header().Set("x-ratelimit-limit-requests", "60")
		io.WriteString(w, "partial")
		w.(http.Flusher).Flush()
	}))
	res := (&upstream.Prober{URL: srv.URL, Timeout: 100 * time.Millisecond}).Probe(context.Background())
	s := res.Sample
	if !s.Err || s.Status != 200 || s.Latency != 100*time.Millisecond || s.Remaining != 10 || !strings.Contains(res.Failure, "timed out") {
		t.Errorf("result %+v, want a timed-out error with status 200 and reading 10/60", res)
	}
}

func TestProbeUnreachable(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL
	srv.Close()
	res := (&upstream.Prober{URL: url, Timeout: time.Second}).Probe(context.Background())
	if !res.Sample.Err || res.Sample.Status != 0 || res.Failure == "" || res.Canceled || res.Sample.Latency >= time.Second {
		t.Errorf("result %+v, want a quick error without a status", res)
	}
	res = (&upstream.Prober{URL: "http://bad host/"}).Probe(context.Background())
	if !res.Sample.Err || res.Failure == "" {
		t.Errorf("a bad URL: %+v, want an error sample", res)
	}
}

// TestProbeCanceled: a probe cut short by its context says so, for the
// caller to drop it.
func TestProbeCanceled(t *testing.T) {
	srv := server(t, hang(t, nil))
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	res := (&upstream.Prober{URL: srv.URL, Timeout: 5 * time.Second}).Probe(ctx)
	if !res.Canceled || !res.Sample.Err || res.Sample.Latency >= time.Second {
		t.Errorf("result %+v, want canceled within the context's 50ms", res)
	}
}

func TestProbeRequest(t *testing.T) {
	type seen struct{ method, host, key, body, contentType string }
	got := make(chan seen, 1)
	srv := server(t, func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		got <- seen{r.Method, r.Host, r.Header.Get("X-Api-Key"), string(body), r.Header.Get("Content-Type")}
	})
	p := &upstream.Prober{
		Method: http.MethodPost,
		URL:    srv.URL,
		Header: http.Header{"x-api-key": {"k1"}, "Content-Type": {"application/json"}, "Host": {"api.example.com"}},
		Body:   []byte(`{"model":"probe"}`),
	}
	for range 2 { // the body is sent again with every probe
		if res := p.Probe(context.Background()); res.Sample.Err {
			t.Fatalf("probe failed: %+v", res)
		}
		want := seen{"POST", "api.example.com", "k1", `{"model":"probe"}`, "application/json"}
		if s := <-got; s != want {
			t.Errorf("the upstream saw %+v, want %+v", s, want)
		}
	}
}

// TestProbeBody: a small body is drained (the connection is reused), a
// large one is read no further than MaxProbeBody.
func TestProbeBody(t *testing.T) {
	const huge = 64 << 20
	var mu sync.Mutex
	addrs := map[string]bool{}
	var written atomic.Int64
	srv := server(t, func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		addrs[r.RemoteAddr] = true
		mu.Unlock()
		if r.URL.Path == "/huge" {
			chunk := make([]byte, 32<<10)
			for written.Load() < huge {
				n, err := w.Write(chunk)
				written.Add(int64(n))
				if err != nil {
					return
				}
			}
			return
		}
		io.WriteString(w, strings.Repeat("x", 1000))
	})
	p := &upstream.Prober{URL: srv.URL + "/small"}
	for range 3 {
		if res := p.Probe(context.Background()); res.Sample.Err {
			t.Fatalf("probe failed: %+v", res)
		}
	}
	if len(addrs) != 1 {
		t.Errorf("3 probes over %d connections, want 1: the body was not drained", len(addrs))
	}
	start := time.Now()
	res := (&upstream.Prober{URL: srv.URL + "/huge", Timeout: 5 * time.Second}).Probe(context.Background())
	if res.Sample.Err || time.Since(start) > time.Second {
		t.Errorf("a huge body: %+v in %s, want success at once", res, time.Since(start))
	}
	if n := written.Load(); n >= huge {
		t.Errorf("the server wrote all %d bytes: the probe read the whole body", n)
	}
}

// TestProbeClock: samples are stamped by the injected clock.
func TestProbeClock(t *testing.T) {
	srv := server(t, func(w http.ResponseWriter, r *http.Request) {})
	var calls atomic.Int64
	clock := func() time.Time { return t0.Add(time.Duration(calls.Add(1)) * 3 * time.Second) }
	res := (&upstream.Prober{URL: srv.URL, Clock: clock}).Probe(context.Background())
	if !res.Sample.At.Equal(t0.Add(6*time.Second)) || res.Sample.Latency != 3*time.Second {
		t.Errorf("sample at %v, latency %s: want the clock's %v and 3s", res.Sample.At, res.Sample.Latency, t0.Add(6*time.Second))
	}
}

// TestProbeHeaderProblem: garbage rate-limit headers make no reading and a
// problem, not an error sample.
func TestProbeHeaderProblem(t *testing.T) {
	srv := server(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("x-ratelimit-remaining-requests", "lots")
		w.Header().Set("x-ratelimit-limit-requests", "60")
	})
	res := (&upstream.Prober{URL: srv.URL}).Probe(context.Background())
	if res.Sample.Err || res.Sample.Remaining != -1 || res.Sample.Limit != -1 || !strings.Contains(res.HeaderProblem, "not a non-negative integer") {
		t.Errorf("result %+v, want a success without a reading and the header problem", res)
	}
}
