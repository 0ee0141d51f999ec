package middleware_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/quotaplane/quotaplane/pkg/enforcer"
	"github.com/quotaplane/quotaplane/pkg/middleware"
)

// TestRemoteInvalidNameIsBadRequest: a name Go's HTTP client will not put
// in a header field (a line break, a NUL) is invalid, to the remote decider
// as to Local: 400, not served. The client sent it unvalidated, so
// http.Client.Do failed, the middleware took it for "the enforcer failed",
// and under FailOpen served the request undebited, without a key of the
// tenant under keyBinding: bound. identify takes the key from a query
// parameter, which arrives percent-decoded (?api_key=x%0Ay).
func TestRemoteInvalidNameIsBadRequest(t *testing.T) {
	identify := func(r *http.Request) (enforcer.Request, error) {
		return enforcer.Request{Tenant: "acme", APIKey: r.URL.Query().Get("api_key"), Endpoint: "read"}, nil
	}
	e := newEngine(t, boundPlane(t))
	c, _ := remote(t, e)
	for name, d := range map[string]middleware.Decider{"local": middleware.Local(e), "remote": c} {
		var a app
		rec := httptest.NewRecorder()
		r := httptest.NewRequest(http.MethodGet, "/v1/read?api_key=not-acmes-key%0A", nil)
		middleware.HTTP(d, identify, middleware.WithFailureMode(middleware.FailOpen))(&a).ServeHTTP(rec, r)
		if a.served.Load() != 0 || rec.Code != http.StatusBadRequest {
			t.Errorf("%s: status %d, served %d; want 400 and not served (a key of no tenant with a line break)", name, rec.Code, a.served.Load())
		}
	}
}
