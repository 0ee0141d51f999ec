package authn

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// Bounds on a token file.
const (
	// MaxTokens bounds the tokens of one file (one per line).
	MaxTokens = 16
	// MinTokenBytes and MaxTokenBytes bound one token: at least 16
	// characters so that a short, guessable token is refused at start.
	MinTokenBytes = 16
	MaxTokenBytes = 4096
)

// Errors of a request's credentials. They say what to send; they never
// echo what was sent.
var (
	ErrMissingToken = errors.New(`missing bearer token: send "Authorization: Bearer <token>"`)
	ErrInvalidToken = errors.New("the bearer token is not one this listener accepts")
)

// Tokens checks bearer tokens against the tokens of a file, read again
// when the file changes. It is safe for concurrent use.
type Tokens struct {
	file string
	w    *watched[tokenSet]
}

// tokenSet holds the SHA-256 digests of the accepted tokens: comparing
// digests of equal length takes the same time whatever the tokens are.
type tokenSet struct {
	digests [][sha256.Size]byte
}

// NewTokenChecker reads the tokens of file (one per line; empty lines and
// the whitespace around a token are ignored; 1 to MaxTokens tokens of
// MinTokenBytes to MaxTokenBytes printable ASCII characters without spaces).
func NewTokenChecker(file string, opts ...Option) (*Tokens, error) {
	w, err := newWatched([]string{file}, func(raw [][]byte) (tokenSet, error) { return parseTokens(file, raw[0]) }, newOptions(opts))
	if err != nil {
		return nil, fmt.Errorf("token file: %w", err)
	}
	return &Tokens{file: file, w: w}, nil
}

func parseTokens(file string, raw []byte) (tokenSet, error) {
	var set tokenSet
	for n, line := range strings.Split(string(raw), "\n") {
		token := strings.TrimSpace(line)
		if token == "" {
			continue
		}
		if len(token) < MinTokenBytes || len(token) > MaxTokenBytes {
			return set, fmt.Errorf("%s line %d: a token must be %d to %d characters long", file, n+1, MinTokenBytes, MaxTokenBytes)
		}
		for i := 0; i < len(token); i++ {
			if token[i] < 0x21 || token[i] > 0x7e {
				return set, fmt.Errorf("%s line %d: a token must be printable ASCII without spaces (it is sent in a header)", file, n+1)
			}
		}
		if len(set.digests) == MaxTokens {
			return set, fmt.Errorf("%s holds more than %d tokens", file, MaxTokens)
		}
		set.digests = append(set.digests, sha256.Sum256([]byte(token)))
	}
	if len(set.digests) == 0 {
		return set, fmt.Errorf("%s holds no token", file)
	}
	return set, nil
}

// Valid reports whether token is one of the file's tokens, in time that
// depends on neither.
func (t *Tokens) Valid(token string) bool {
	digest := sha256.Sum256([]byte(token))
	set := t.w.get()
	match := 0
	for i := range set.digests { // all of them: no early exit
		match |= subtle.ConstantTimeCompare(digest[:], set.digests[i][:])
	}
	return match == 1
}

// Authorize checks the values of a request's Authorization field: exactly
// one, "Bearer <token>" with a valid token.
func (t *Tokens) Authorize(values []string) error {
	if len(values) == 0 {
		return ErrMissingToken
	}
	if len(values) > 1 {
		return errors.New("send one Authorization field, not several")
	}
	scheme, token, _ := strings.Cut(strings.TrimSpace(values[0]), " ")
	if !strings.EqualFold(scheme, "Bearer") {
		return errors.New(`the Authorization field must be "Bearer <token>"`)
	}
	if !t.Valid(strings.TrimSpace(token)) {
		return ErrInvalidToken
	}
	return nil
}

// HTTP requires a valid bearer token on every request to next; t nil
// returns next. A request without one gets 401 with WWW-Authenticate:
// Bearer and a JSON body {"error": "..."}.
func HTTP(next http.Handler, t *Tokens) http.Handler {
	if t == nil {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		err := t.Authorize(r.Header.Values("Authorization"))
		if err == nil {
			next.ServeHTTP(w, r)
			return
		}
		challenge := `Bearer realm="quotaplane"`
		if !errors.Is(err, ErrMissingToken) {
			challenge += `, error="invalid_token"`
		}
		w.Header().Set("WWW-Authenticate", challenge)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		w.WriteHeader(http.StatusUnauthorized)
		_ = json.NewEncoder(w).Encode(struct {
			Error string `json:"error"`
		}{err.Error()})
	})
}

// authorizeContext checks the "authorization" metadata of a gRPC call.
func (t *Tokens) authorizeContext(ctx context.Context) error {
	md, _ := metadata.FromIncomingContext(ctx)
	if err := t.Authorize(md.Get("authorization")); err != nil {
		return status.Error(codes.Unauthenticated, err.Error())
	}
	return nil
}

// UnaryServerInterceptor refuses unary calls without a valid bearer token
// in their "authorization" metadata with codes.Unauthenticated.
func (t *Tokens) UnaryServerInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if err := t.authorizeContext(ctx); err != nil {
			return nil, err
		}
		return handler(ctx, req)
	}
}

// StreamServerInterceptor is UnaryServerInterceptor for streams.
func (t *Tokens) StreamServerInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if err := t.authorizeContext(ss.Context()); err != nil {
			return err
		}
		return handler(srv, ss)
	}
}
