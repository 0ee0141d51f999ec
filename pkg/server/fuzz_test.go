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

// FuzzForwardAuth sends arbitrary forwarded requests to forward auth, on a
// plane with Exact, Pattern and PathPrefix matches and an engine whose
// clock stands still: it must never panic; a request is decided (200, or
// a denial with Retry-After and X-Quota-Level) or refused with a 400 or
// 403 that says why in X-Quota-Reason; /auth-request answers nothing but
// a 200 or a 403, whatever the query; and only a 200 moves a bucket.
//
//	go test -run '^$' -fuzz FuzzForwardAuth -fuzztime 30s ./pkg/server/
func FuzzForwardAuth(f *testing.F) {
	f.Add(false, "", "POST", "/v1/models/gpt/generate", "acme", "k1", "")
	f.Add(false, "", "GET", "/v1/models?page=2", "free-1", "k1", "3")
	f.Add(true, "", "POST", "/v1/models/x/../y/generate", "free-1", "k1", "1000000")
	f.Add(false, "deny-status=403", "get", "/v1/models/%2F/generate", "t", "k", "")
	f.Add(true, "x=1", "GET", "v1/models", "a b", "\x00", "-1")
	f.Add(false, "", "GET /", "/v1/%zz#f", "", "", "")
	f.Add(true, "", "DELETE", "//v1//models/./", "t2", "k", "2")
	h, e := gatewayAPI(f, gatewayPlane("default", "default"))
	f.Fuzz(func(t *testing.T, authRequest bool, query, method, uri, tenant, key, units string) {
		req := httptest.NewRequest(http.MethodGet, ForwardAuthPath, nil)
		if authRequest {
			req.URL.Path = AuthRequestPath
		}
		req.URL.RawQuery = query
		for name, v := range map[string]string{HeaderForwardedMethod: method, HeaderForwardedURI: uri, HeaderTenant: tenant, HeaderAPIKey: key, HeaderUnits: units} {
			if v != "" {
				req.Header[name] = []string{v}
			}
		}
		before := buckets(e, tenant)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		after := buckets(e, tenant)
		hdr := rec.Header()
		switch rec.Code {
		case http.StatusOK:
			if hdr.Get(HeaderRateLimit) == "" || hdr.Get(HeaderRateLimitPolicy) == "" {
				t.Fatalf("an allow without %s and %s: %v", HeaderRateLimit, HeaderRateLimitPolicy, hdr)
			}
			return
		case http.StatusTooManyRequests, http.StatusForbidden, http.StatusBadRequest:
		default:
			t.Fatalf("status %d: %s", rec.Code, rec.Body)
		}
		denial := hdr.Get("Retry-After") != ""
		switch {
		case denial && (hdr.Get(HeaderLevel) == "" || hdr.Get(HeaderRateLimit) == "" || hdr.Get(HeaderReason) == ""):
			t.Fatalf("a denial without %s, %s or %s: %v", HeaderLevel, HeaderRateLimit, HeaderReason, hdr)
		case rec.Code == http.StatusTooManyRequests && !denial:
			t.Fatalf("a 429 without Retry-After: %v", hdr)
		case !denial && hdr.Get(HeaderReason) == "":
			t.Fatalf("a %d refusal without %s: %s", rec.Code, HeaderReason, rec.Body)
		}
		if authRequest && rec.Code != http.StatusForbidden {
			t.Fatalf("%s answered %d", AuthRequestPath, rec.Code)
		}
		if before != after && !(denial && before == planeBuckets(e)) {
			// A denial may give the tenant its state, full: it debits nothing.
			t.Fatalf("a %d moved buckets: %s, then %s", rec.Code, before, after)
		}
	})
}
