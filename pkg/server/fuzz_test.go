package server

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
)

// FuzzAPI sends arbitrary methods, endpoints, headers and bodies to the
// decision API: it must never panic, and every answer must be one of the
// statuses the API documents (or the redirect net/http's mux answers an
// unclean path with), with a JSON body (an error saying what is
// wrong, or a decision), and Retry-After and X-Quota-Level on a 429.
//
//	go test -run '^$' -fuzz FuzzAPI -fuzztime 30s ./pkg/server/
func FuzzAPI(f *testing.F) {
	f.Add("POST", "read", "acme", "k1", "", "")
	f.Add("POST", "export", "free-trial", "k1", "2", "")
	f.Add("GET", "write", "whale-1", "k", "", "body")
	f.Add("POST", "", "", "", "-1", "")
	f.Add("POST", "read%2F..", "a b", "\x00", "99999999999999999999", "")
	h := sampleAPI(f)
	allowed := map[int]bool{200: true, 400: true, 403: true, 404: true, 405: true, 413: true, 429: true, 503: true}
	f.Fuzz(func(t *testing.T, method, endpoint, tenant, key, units, body string) {
		if !validMethod(method) {
			return // net/http refuses these before any handler
		}
		req := httptest.NewRequest(http.MethodGet, "/", strings.NewReader(body))
		req.Method = method
		req.URL = &url.URL{Path: "/api/" + endpoint}
		for name, v := range map[string]string{HeaderTenant: tenant, HeaderAPIKey: key, HeaderUnits: units} {
			if v != "" {
				req.Header[name] = []string{v}
			}
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code == http.StatusMovedPermanently || rec.Code == http.StatusTemporaryRedirect || rec.Code == http.StatusPermanentRedirect {
			if rec.Header().Get("Location") == "" {
				t.Fatalf("a redirect without Location")
			}
			return // net/http's ServeMux redirects unclean paths (/api/., //) to their clean form
		}
		if !allowed[rec.Code] {
			t.Fatalf("%s /api/%q: status %d: %s", method, endpoint, rec.Code, rec.Body)
		}
		var v map[string]any
		if err := json.Unmarshal(rec.Body.Bytes(), &v); err != nil {
			t.Fatalf("status %d: the body is not JSON: %q", rec.Code, rec.Body)
		}
		if rec.Code == http.StatusTooManyRequests && (rec.Header().Get("Retry-After") == "" || rec.Header().Get(HeaderLevel) == "") {
			t.Fatalf("a 429 without Retry-After or %s: %v", HeaderLevel, rec.Header())
		}
		if (rec.Code == http.StatusOK || rec.Code == http.StatusTooManyRequests) &&
			(rec.Header().Get(HeaderRateLimitPolicy) == "" || rec.Header().Get(HeaderRateLimit) == "") {
			t.Fatalf("a decision without %s and %s: %v", HeaderRateLimitPolicy, HeaderRateLimit, rec.Header())
		}
		if rec.Code >= 400 && rec.Code != http.StatusTooManyRequests && v["error"] == "" {
			t.Fatalf("status %d without an error message: %s", rec.Code, rec.Body)
		}
	})
}

func validMethod(m string) bool {
	if m == "" {
		return false
	}
	for _, r := range m {
		if r <= ' ' || r >= 0x7f || strings.ContainsRune("()<>@,;:\\\"/[]?={}", r) {
			return false
		}
	}
	return true
}
