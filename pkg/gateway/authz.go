package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"

	"github.com/quotaplane/quotaplane/pkg/enforcer"
	"github.com/quotaplane/quotaplane/pkg/policy"
	"github.com/quotaplane/quotaplane/pkg/quotaheaders"
)

// EndpointExtension is the context extension (Envoy's per-route
// check_settings.context_extensions) that names a route's endpoint, in
// place of classifying its path.
const EndpointExtension = "quotaplane-endpoint"

// The request header fields Check reads, as Envoy sends them (lower case).
var (
	tenantHeader = strings.ToLower(quotaheaders.Tenant)
	apiKeyHeader = strings.ToLower(quotaheaders.APIKey)
	unitsHeader  = strings.ToLower(quotaheaders.Units)
)

// authorizationService is envoy.service.auth.v3.Authorization.
type authorizationService struct {
	authv3.UnimplementedAuthorizationServer
	engine  func() (*enforcer.Engine, error)
	observe Observer
}

// Check decides the original request of req: see the package doc.
func (s *authorizationService) Check(ctx context.Context, req *authv3.CheckRequest) (*authv3.CheckResponse, error) {
	e, err := s.engine()
	if err != nil {
		return nil, err
	}
	r, problem := checkRequest(e.Policy(), req)
	if problem != "" {
		return deniedCheck(typev3.StatusCode_BadRequest, codes.InvalidArgument, nil, errorBody(problem)), nil
	}
	start := time.Now()
	d, err := e.Decide(ctx, r)
	if err != nil {
		if level, ok := enforcer.RefusedAt(err); ok {
			// Refused by the plane (as forward auth answers it): 403, no
			// Retry-After, since retrying will not help.
			headers := []*corev3.HeaderValueOption{header(quotaheaders.Level, string(level)), header(quotaheaders.Reason, quotaheaders.Text(err.Error(), quotaheaders.MaxReasonBytes))}
			return deniedCheck(typev3.StatusCode_Forbidden, codes.PermissionDenied, headers, errorBody(err.Error())), nil
		}
		if errors.Is(err, enforcer.ErrInvalidRequest) {
			return deniedCheck(typev3.StatusCode_BadRequest, codes.InvalidArgument, nil, errorBody(err.Error())), nil
		}
		return nil, engineStatus(err)
	}
	s.observe(&r, &d, time.Since(start))
	limits := d.Limits(&r)
	headers := make([]*corev3.HeaderValueOption, 0, 5)
	quotaheaders.Each(&limits, &d, func(name, value string) { headers = append(headers, header(name, value)) })
	if d.Allow {
		return &authv3.CheckResponse{
			Status:       &rpcstatus.Status{Code: int32(codes.OK)},
			HttpResponse: &authv3.CheckResponse_OkResponse{OkResponse: &authv3.OkHttpResponse{ResponseHeadersToAdd: headers}},
		}, nil
	}
	body, _ := json.Marshal(deniedBody{
		Allowed: false, Tenant: r.Tenant, Endpoint: r.Endpoint, Cost: d.Cost, Remaining: d.Remaining,
		Level: string(d.Level), Reason: d.Reason, RetryAfterSec: d.RetryAfter.Seconds(),
	})
	if d.Suspended {
		return deniedCheck(typev3.StatusCode_ServiceUnavailable, codes.Unavailable, headers, string(body)+"\n"), nil
	}
	return deniedCheck(typev3.StatusCode_TooManyRequests, codes.ResourceExhausted, headers, string(body)+"\n"), nil
}

// deniedBody is the JSON body of a 429, as the decision API writes it.
type deniedBody struct {
	Allowed       bool    `json:"allowed"`
	Tenant        string  `json:"tenant"`
	Endpoint      string  `json:"endpoint"`
	Cost          int64   `json:"cost"`
	Remaining     int64   `json:"remaining"`
	Level         string  `json:"level,omitempty"`
	Reason        string  `json:"reason,omitempty"`
	RetryAfterSec float64 `json:"retryAfterSeconds,omitempty"`
}

func errorBody(message string) string {
	b, _ := json.Marshal(struct {
		Error string `json:"error"`
	}{message})
	return string(b) + "\n"
}

// deniedCheck is a denial Envoy sends downstream as it is: an HTTP status,
// headers and a JSON body.
func deniedCheck(code typev3.StatusCode, grpcCode codes.Code, headers []*corev3.HeaderValueOption, body string) *authv3.CheckResponse {
	headers = append(headers, header("Content-Type", "application/json"), header("Cache-Control", "no-store"))
	return &authv3.CheckResponse{
		Status: &rpcstatus.Status{Code: int32(grpcCode)},
		HttpResponse: &authv3.CheckResponse_DeniedResponse{DeniedResponse: &authv3.DeniedHttpResponse{
			Status: &typev3.HttpStatus{Code: code}, Headers: headers, Body: body,
		}},
	}
}

// header is a header field that replaces one of the same name.
func header(name, value string) *corev3.HeaderValueOption {
	return &corev3.HeaderValueOption{
		Header:       &corev3.HeaderValue{Key: name, Value: value},
		AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
	}
}

// checkRequest reads the quotaplane request out of a CheckRequest under
// policy p: the tenant from x-tenant, the api key from x-api-key, units from x-quota-units, and the endpoint from
// the quotaplane-endpoint context extension or else by classifying the
// method and canonical path (no match: no named endpoint). A non-empty
// problem says what is wrong with it.
func checkRequest(p *policy.Policy, req *authv3.CheckRequest) (r enforcer.Request, problem string) {
	h := req.GetAttributes().GetRequest().GetHttp()
	if h == nil {
		return r, "the CheckRequest has no attributes.request.http: quotaplane authorizes HTTP requests"
	}
	var fields headerFields
	fields.read(h)
	if fields.problem != "" {
		return r, fields.problem
	}
	switch {
	case !fields.tenant.found:
		return r, "missing " + quotaheaders.Tenant + " header: name the tenant this request is for"
	case !fields.apiKey.found:
		return r, "missing " + quotaheaders.APIKey + " header: name the api key this request uses"
	}
	r.Tenant, r.APIKey = fields.tenant.value, fields.apiKey.value
	if fields.units.found {
		units, err := strconv.ParseInt(fields.units.value, 10, 64)
		if err != nil || units < 1 || units > enforcer.MaxUnits {
			return r, fmt.Sprintf("%s must be a whole number from 1 to %d, not %q", quotaheaders.Units, enforcer.MaxUnits, clip(fields.units.value))
		}
		r.Units = units
	}
	if name, ok := req.GetAttributes().GetContextExtensions()[EndpointExtension]; ok {
		r.Endpoint = name
	} else {
		canonical, err := policy.CanonicalPath(h.GetPath())
		if err != nil {
			return r, "the request's path: " + err.Error()
		}
		r.Endpoint, _ = p.MatchEndpoint(h.GetMethod(), canonical)
	}
	if err := enforcer.ValidateRequest(&r); err != nil {
		return r, err.Error()
	}
	return r, ""
}

// headerFields are the request header fields Check reads, each at most
// once.
type headerFields struct {
	tenant, apiKey, units field
	problem               string
}

type field struct {
	value string
	found bool
}

// read takes the fields from h's headers, or from its header_map when
// Envoy sends raw headers (encode_raw_headers), where a field may appear
// more than once.
func (f *headerFields) read(h *authv3.AttributeContext_HttpRequest) {
	if m := h.GetHeaderMap(); m != nil && len(h.GetHeaders()) == 0 {
		for _, hv := range m.GetHeaders() {
			value := hv.GetValue()
			if raw := hv.GetRawValue(); len(raw) > 0 {
				value = string(raw)
			}
			f.set(strings.ToLower(hv.GetKey()), value)
		}
		return
	}
	for name, value := range h.GetHeaders() {
		f.set(name, value)
	}
}

func (f *headerFields) set(name, value string) {
	var dst *field
	switch name {
	case tenantHeader:
		dst = &f.tenant
	case apiKeyHeader:
		dst = &f.apiKey
	case unitsHeader:
		dst = &f.units
	default:
		return
	}
	if dst.found && f.problem == "" {
		f.problem = fmt.Sprintf("send %s, %s and %s at most once each", quotaheaders.Tenant, quotaheaders.APIKey, quotaheaders.Units)
	}
	dst.value, dst.found = value, true
}
