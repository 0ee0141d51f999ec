package client_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/quotaplane/quotaplane/config/samples"
	"github.com/quotaplane/quotaplane/pkg/client"
	"github.com/quotaplane/quotaplane/pkg/enforcer"
	"github.com/quotaplane/quotaplane/pkg/policy"
	"github.com/quotaplane/quotaplane/pkg/server"
)

// An enforcer on the sample plane, whose clock stands still so the output
// does not depend on when the example runs; then three exports by a free
// tenant, whose bucket holds two.
func ExampleNew() {
	p, err := policy.LoadFS(samples.FS)
	if err != nil {
		panic(err)
	}
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	engine, err := enforcer.New(p, enforcer.WithClock(func() time.Time { return now }))
	if err != nil {
		panic(err)
	}
	defer engine.Close()
	enforcerAPI := httptest.NewServer(server.NewAPI(engine, nil))
	defer enforcerAPI.Close()

	c, err := client.New(enforcerAPI.URL) // with client.WithBearerToken, client.WithTLSConfig as the enforcer needs
	if err != nil {
		panic(err)
	}
	for range 3 {
		header := http.Header{}
		d, err := c.Decide(context.Background(), enforcer.Request{Tenant: "free-trial", Endpoint: "export", APIKey: "k1"}, header)
		if err != nil {
			panic(err)
		}
		if d.Allow {
			fmt.Printf("allowed, %d left at level %s; RateLimit: %s\n", d.Remaining, d.Bound, header.Get("RateLimit"))
			continue
		}
		fmt.Printf("denied at level %s (%s), retry after %s; Retry-After: %s\n", d.Level, d.Reason, d.RetryAfter, header.Get("Retry-After"))
	}

	// A tenant name with a space is not a decision but a 400.
	_, err = c.Decide(context.Background(), enforcer.Request{Tenant: "free trial", Endpoint: "export", APIKey: "k1"}, nil)
	var answer *client.StatusError
	if errors.As(err, &answer) {
		fmt.Println(answer.StatusCode, errors.Is(err, client.ErrBadRequest))
	}
	// Output:
	// allowed, 50 left at level tenant; RateLimit: "tenant";r=50;t=1
	// allowed, 0 left at level tenant; RateLimit: "tenant";r=0;t=2
	// denied at level tenant (tenant limit of 50 per 1s (burst 100) is used up), retry after 1s; Retry-After: 1
	// 400 true
}
