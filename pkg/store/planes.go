package store

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/quotaplane/quotaplane/pkg/keyspace"
)

// maxPlanes bounds the planes Planes lists.
const maxPlanes = 10_000

// Planes lists the planes that have a policy hash in c (qp:{P}:policy), by
// name, scanning every master of a cluster. It is for operators' tools
// (quotactl status), not for the hot path: SCAN walks the whole keyspace.
func Planes(ctx context.Context, c redis.UniversalClient) ([]string, error) {
	var planes []string
	scan := func(ctx context.Context, node redis.Cmdable) error {
		iter := node.ScanType(ctx, 0, "qp:{*}:policy", 1000, "hash").Iterator()
		for iter.Next(ctx) {
			if plane, ok := planeOfPolicyKey(iter.Val()); ok {
				planes = append(planes, plane)
			}
			if len(planes) > maxPlanes {
				return fmt.Errorf("more than %d planes: name one", maxPlanes)
			}
		}
		return iter.Err()
	}
	var err error
	if cc, ok := c.(*redis.ClusterClient); ok {
		var mu sync.Mutex // the masters' scans append to one slice
		err = cc.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
			mu.Lock()
			defer mu.Unlock()
			return scan(ctx, m)
		})
	} else {
		err = scan(ctx, c)
	}
	if err != nil {
		return nil, fmt.Errorf("store: list the planes: %w", err)
	}
	slices.Sort(planes)
	return slices.Compact(planes), nil
}

// planeOfPolicyKey is the plane whose policy hash key names, keyspace.Policy's
// inverse.
func planeOfPolicyKey(key string) (string, bool) {
	plane, ok := strings.CutPrefix(key, "qp:{")
	if !ok {
		return "", false
	}
	plane, ok = strings.CutSuffix(plane, "}:policy")
	if !ok || ValidatePlane(plane) != nil || keyspace.Policy(plane) != key {
		return "", false
	}
	return plane, true
}

// Versions are what the store holds of a plane's policy: the current
// version, its content hash and the kept versions, oldest first.
type Versions struct {
	Current int64
	Hash    string
	Kept    []int64
}

// Versions reads the plane's current version and the versions kept. It is
// ErrNoPolicy when none is published.
func (s *Store) Versions(ctx context.Context) (Versions, error) {
	fields, err := s.client.HKeys(ctx, s.key).Result()
	if err != nil {
		return Versions{}, fmt.Errorf("store: plane %q: list the versions: %w", s.plane, err)
	}
	h, err := s.readHead(ctx)
	if err != nil {
		return Versions{}, err
	}
	v := Versions{Current: h.version, Hash: h.hash}
	for _, f := range fields {
		if n, err := strconv.ParseInt(strings.TrimPrefix(f, "v"), 10, 64); err == nil && strings.HasPrefix(f, "v") && n > 0 {
			v.Kept = append(v.Kept, n)
		}
	}
	slices.Sort(v.Kept)
	return v, nil
}
