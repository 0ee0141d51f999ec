package load

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotaplane/quotaplane/pkg/enforcer"
	"github.com/quotaplane/quotaplane/pkg/policy"
)

// Target decides requests. Node picks one of its Nodes (an engine of the
// simulated fleet, or an enforcer URL).
type Target interface {
	Nodes() int
	// Decide decides r on node; now is the virtual time, or the zero time
	// in real time.
	Decide(ctx context.Context, node int, now time.Time, r *enforcer.Request) (enforcer.Decision, error)
	Close() error
}

// Fleet is a simulated fleet: N engines in this process, each its own node,
// sharing one Redis in the distributed modes.
type Fleet struct {
	Engines []*enforcer.Engine
}

// NewFleet starts n engines on p. rdb may be nil in mode local; extra
// options go to every engine.
func NewFleet(p *policy.Policy, n int, rdb redis.UniversalClient, extra ...enforcer.Option) (*Fleet, error) {
	if n < 1 {
		return nil, fmt.Errorf("load: a fleet of %d nodes: need at least 1", n)
	}
	f := &Fleet{}
	for i := range n {
		opts := append([]enforcer.Option{enforcer.WithNodeID(fmt.Sprintf("load-node-%d", i))}, extra...)
		if rdb != nil {
			opts = append(opts, enforcer.WithRedis(rdb))
		}
		e, err := enforcer.New(p, opts...)
		if err != nil {
			_ = f.Close()
			return nil, fmt.Errorf("load: node %d: %w", i, err)
		}
		f.Engines = append(f.Engines, e)
	}
	return f, nil
}

func (f *Fleet) Nodes() int { return len(f.Engines) }

func (f *Fleet) Decide(ctx context.Context, node int, now time.Time, r *enforcer.Request) (enforcer.Decision, error) {
	if now.IsZero() {
		return f.Engines[node].Decide(ctx, *r)
	}
	return f.Engines[node].DecideAt(now, *r)
}

func (f *Fleet) Close() error {
	var errs []error
	for _, e := range f.Engines {
		errs = append(errs, e.Close())
	}
	return errors.Join(errs...)
}

// HTTPTarget sends each decision to an enforcer's POST /api/{endpoint} over
// pooled keep-alive connections; node picks the URL. It runs in real time
// only. A request's Tier cannot travel over HTTP: the plane must name the
// tenants (TenantQuotas) whose tier matters.
type HTTPTarget struct {
	URLs   []string
	client *http.Client
}

// NewHTTPTarget targets the enforcers at urls (http://host:port).
func NewHTTPTarget(urls []string, conns int) (*HTTPTarget, error) {
	if len(urls) == 0 {
		return nil, errors.New("load: no enforcer URLs")
	}
	tr := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 2 * time.Second}).DialContext,
		MaxIdleConns:        conns * len(urls),
		MaxIdleConnsPerHost: conns,
		MaxConnsPerHost:     conns,
		IdleConnTimeout:     time.Minute,
	}
	return &HTTPTarget{URLs: urls, client: &http.Client{Transport: tr, Timeout: 10 * time.Second}}, nil
}

func (h *HTTPTarget) Nodes() int { return len(h.URLs) }

func (h *HTTPTarget) Decide(ctx context.Context, node int, _ time.Time, r *enforcer.Request) (enforcer.Decision, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.URLs[node]+"/api/"+r.Endpoint, nil)
	if err != nil {
		return enforcer.Decision{}, err
	}
	req.Header.Set("X-Tenant", r.Tenant)
	req.Header.Set("X-Api-Key", r.APIKey)
	if r.Units > 1 {
		req.Header.Set("X-Quota-Units", strconv.FormatInt(r.Units, 10))
	}
	resp, err := h.client.Do(req)
	if err != nil {
		return enforcer.Decision{}, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	class := resp.Header.Get("X-Tier") // set while the endpoint's upstream is degraded
	switch resp.StatusCode {
	case http.StatusOK:
		return enforcer.Decision{Allow: true, Class: class}, nil
	case http.StatusTooManyRequests:
		return enforcer.Decision{Level: enforcer.Level(resp.Header.Get("X-Quota-Level")), Class: class}, nil
	case http.StatusServiceUnavailable:
		if resp.Header.Get("X-Outage-Mode") == "true" {
			return enforcer.Decision{Level: enforcer.LevelUpstream, Class: class, Suspended: true}, nil
		}
	}
	return enforcer.Decision{}, fmt.Errorf("load: %s answered %s", h.URLs[node], resp.Status)
}

func (h *HTTPTarget) Close() error {
	h.client.CloseIdleConnections()
	return nil
}

// Null admits everything at once: the generator's own cost, alone.
type Null struct{}

func (Null) Nodes() int { return 1 }

func (Null) Decide(context.Context, int, time.Time, *enforcer.Request) (enforcer.Decision, error) {
	return enforcer.Decision{Allow: true}, nil
}

func (Null) Close() error { return nil }
