package store_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/quotaplane/quotaplane/pkg/redistest"
	"github.com/quotaplane/quotaplane/pkg/store"
)

// Planes finds the planes with a policy and Versions what each keeps, on a
// single Redis and across a cluster's masters.
func TestPlanesAndVersions(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		client func(t *testing.T) redis.UniversalClient
	}{
		{"single", func(t *testing.T) redis.UniversalClient { return redistest.Start(t).Client() }},
		{"cluster", func(t *testing.T) redis.UniversalClient { return redistest.StartCluster(t, 3).Client(t) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := tc.client(t)
			if planes, err := store.Planes(ctx, c); err != nil || len(planes) != 0 {
				t.Fatalf("an empty Redis: %v, %v", planes, err)
			}
			want := []string{"default/a", "default/b", "default/c"}
			for i, plane := range want {
				st, _ := store.New(c, plane, store.WithKeep(2))
				for v := range i + 1 {
					publish(t, st, samplePolicyOf(t, plane, int64(1000+v)))
				}
			}
			// Keys that are not a plane's policy hash do not count.
			if err := c.Set(ctx, "qp:{default/x}:policy:other", "1", 0).Err(); err != nil {
				t.Fatal(err)
			}
			if err := c.Set(ctx, "qp:{default/y}:policy", "not a hash", 0).Err(); err != nil {
				t.Fatal(err)
			}
			planes, err := store.Planes(ctx, c)
			if err != nil || !slices.Equal(planes, want) {
				t.Fatalf("planes %v, %v; want %v", planes, err, want)
			}
			st, _ := store.New(c, "default/c", store.WithKeep(2))
			v, err := st.Versions(ctx)
			if err != nil || v.Current != 3 || !slices.Equal(v.Kept, []int64{2, 3}) || len(v.Hash) != 64 {
				t.Errorf("default/c: %+v, %v; want current 3, kept 2 and 3", v, err)
			}
			none, _ := store.New(c, "default/none")
			if _, err := none.Versions(ctx); !errors.Is(err, store.ErrNoPolicy) {
				t.Errorf("a plane without a policy: %v, want ErrNoPolicy", err)
			}
		})
	}
}
