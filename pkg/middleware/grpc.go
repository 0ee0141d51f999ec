package middleware

import (
	"context"
	"fmt"
	"net/http"
	"strings"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/quotaplane/quotaplane/pkg/enforcer"
	"github.com/quotaplane/quotaplane/pkg/quotaheaders"
)

// CallIdentity names a call's tenant, endpoint, api key and units from its
// context (peer, authentication), its full method name
// ("/package.Service/Method") and its incoming metadata.
type CallIdentity func(ctx context.Context, fullMethod string, md metadata.MD) (enforcer.Request, error)

// UnaryServerInterceptor decides each unary call before its handler runs,
// as HTTP does for requests:
//
//   - allowed: the handler runs; the response's header metadata carries
//     ratelimit-policy and ratelimit.
//   - denied: codes.ResourceExhausted, whose message names the level and the
//     reason, with the quota fields as header metadata (lower-case:
//     retry-after, x-quota-level, x-quota-reason, ratelimit, ratelimit-policy)
//     and google.rpc.RetryInfo and QuotaFailure details.
//   - an error from identify: codes.InvalidArgument with its message;
//     refused by the plane: codes.PermissionDenied with x-quota-level and
//     x-quota-reason.
//   - the decider failed: codes.Unavailable (FailClosed) or the handler runs
//     (FailOpen).
func UnaryServerInterceptor(d Decider, identify CallIdentity, opts ...Option) grpc.UnaryServerInterceptor {
	g := &callGuard{decider: d, identify: identify, settings: newSettings(opts)}
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if err := g.admit(ctx, info.FullMethod, func(md metadata.MD) error { return grpc.SetHeader(ctx, md) }); err != nil {
			return nil, err
		}
		return handler(ctx, req)
	}
}

// StreamServerInterceptor decides each stream once, when it opens, as
// UnaryServerInterceptor decides a call; a stream's messages are not
// decided one by one.
func StreamServerInterceptor(d Decider, identify CallIdentity, opts ...Option) grpc.StreamServerInterceptor {
	g := &callGuard{decider: d, identify: identify, settings: newSettings(opts)}
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if err := g.admit(ss.Context(), info.FullMethod, ss.SetHeader); err != nil {
			return err
		}
		return handler(srv, ss)
	}
}

type callGuard struct {
	decider  Decider
	identify CallIdentity
	settings settings
}

// admit decides a call; a nil error lets it run. setHeader sends the quota
// fields as header metadata.
func (g *callGuard) admit(ctx context.Context, fullMethod string, setHeader func(metadata.MD) error) error {
	md, _ := metadata.FromIncomingContext(ctx)
	r, err := g.identify(ctx, fullMethod, md)
	if err != nil {
		return status.Error(codes.InvalidArgument, err.Error())
	}
	header := make(http.Header, 5)
	d, err := g.decider.Decide(ctx, r, header)
	if err != nil {
		switch outcome, level := classify(err); outcome {
		case invalid:
			return status.Error(codes.InvalidArgument, message(err))
		case refused:
			msg := message(err)
			md := metadata.Pairs("x-quota-reason", quotaheaders.Text(msg, quotaheaders.MaxReasonBytes))
			if level != enforcer.LevelNone {
				md.Set("x-quota-level", string(level))
			}
			if err := setHeader(md); err != nil {
				return status.Errorf(codes.Internal, "sending the quota header metadata: %v", err)
			}
			return status.Error(codes.PermissionDenied, msg)
		}
		g.settings.failure(ctx, err)
		if g.settings.failureMode == FailOpen {
			return nil
		}
		return status.Error(codes.Unavailable, "the quota check failed, so the call was not served; retry shortly")
	}
	out := make(metadata.MD, len(header))
	for name, values := range header {
		out[strings.ToLower(name)] = values
	}
	if err := setHeader(out); err != nil {
		return status.Errorf(codes.Internal, "sending the quota header metadata: %v", err)
	}
	if d.Allow {
		return nil
	}
	return denialStatus(&d)
}

// denialStatus is a denial as codes.ResourceExhausted with RetryInfo and
// QuotaFailure details.
func denialStatus(d *enforcer.Decision) error {
	retryAfter := quotaheaders.RetryAfterSeconds(d.RetryAfter)
	code := codes.ResourceExhausted
	if d.Suspended {
		code = codes.Unavailable // the upstream is degraded and this tenant's class suspended
	}
	st := status.New(code,
		fmt.Sprintf("quota exceeded at level %s: %s; retry after %ds", d.Level, d.Reason, retryAfter))
	detailed, err := st.WithDetails(
		&errdetails.RetryInfo{RetryDelay: durationpb.New(d.RetryAfter)},
		&errdetails.QuotaFailure{Violations: []*errdetails.QuotaFailure_Violation{{
			Subject: string(d.Level), Description: d.Reason,
		}}},
	)
	if err != nil { // the details are well-formed messages: cannot happen
		return st.Err()
	}
	return detailed.Err()
}
