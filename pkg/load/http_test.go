package load

import (
	"context"
	"net/http/httptest"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/quotaplane/quotaplane/pkg/enforcer"
	"github.com/quotaplane/quotaplane/pkg/server"
)

// TestHTTPTarget runs a profile against two real decision APIs (pkg/server
// on loopback, each on its own engine) and checks that what the generator
// counted is what the servers decided: every request, every admission, and
// every denial at the level the 429 named.
func TestHTTPTarget(t *testing.T) {
	var urls []string
	var metrics []*server.Metrics
	for range 2 {
		e, err := enforcer.New(handPlane(t))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.Close() })
		m := server.NewMetrics(e, nil)
		srv := httptest.NewServer(server.NewAPI(e, m))
		t.Cleanup(srv.Close)
		urls, metrics = append(urls, srv.URL), append(metrics, m)
	}
	target, err := NewHTTPTarget(urls, 8)
	if err != nil {
		t.Fatal(err)
	}
	defer target.Close()
	p := smallProfile(4)
	p.Endpoints = []Endpoint{{"read", 0.8}, {"write", 0.2}}
	p.Rate, p.Duration = 600, time.Second
	res, err := Run(context.Background(), build(t, p), target, Options{Workers: 4})
	if err != nil {
		t.Fatal(err)
	}
	var decided, admitted int64
	denied := map[string]int64{}
	for _, m := range metrics {
		decided += m.Decisions()
		families, err := m.Registry.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range families {
			for _, metric := range f.GetMetric() {
				switch f.GetName() {
				case "quotaplane_enforcer_admitted_total":
					admitted += int64(metric.GetCounter().GetValue())
				case "quotaplane_enforcer_denied_total":
					denied[label(metric, "level")] += int64(metric.GetCounter().GetValue())
				}
			}
		}
	}
	tot := res.Totals
	t.Logf("generator: %d offered, %d admitted, denied %v (global, tenant, endpoint, key), %d errors; servers: %d decided, %d admitted, denied %v",
		tot.Offered, tot.Admitted, tot.Denied, res.Errors, decided, admitted, denied)
	if res.Errors != 0 || tot.Offered == 0 || tot.Offered != decided || tot.Admitted != admitted {
		t.Fatalf("the generator counted %d decisions (%d admitted, %d errors); the servers made %d (%d admitted)", tot.Offered, tot.Admitted, res.Errors, decided, admitted)
	}
	var anyDenied bool
	for i, l := range enforcer.Levels {
		if tot.Denied[i] != denied[string(l)] {
			t.Errorf("denied at %s: the generator counted %d, the servers %d", l, tot.Denied[i], denied[string(l)])
		}
		anyDenied = anyDenied || tot.Denied[i] > 0
	}
	if !anyDenied {
		t.Error("nothing was denied: the check of the 429s' levels checked nothing")
	}
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}
