package upstream

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// PublishPlan stores plan as its plane's current plan (PlanKey) with a new
// seq, stamped with Redis TIME, expiring PlanTTL later unless published
// again; it sets plan.Seq and plan.PublishedMs to what it stored.
func PublishPlan(ctx context.Context, c redis.UniversalClient, plan *Plan) error {
	body, err := plan.Encode()
	if err != nil {
		return fmt.Errorf("publish upstream plan: %w", err)
	}
	now, err := c.Time(ctx).Result()
	if err != nil {
		return fmt.Errorf("publish upstream plan: %w", err)
	}
	key := PlanKey(plan.Plane)
	var seq *redis.IntCmd
	_, err = c.TxPipelined(ctx, func(p redis.Pipeliner) error {
		seq = p.HIncrBy(ctx, key, "seq", 1)
		p.HSet(ctx, key, "at", now.UnixMilli(), "body", body)
		p.PExpire(ctx, key, PlanTTL)
		return nil
	})
	if err != nil {
		return fmt.Errorf("publish upstream plan: %w", err)
	}
	plan.Seq, plan.PublishedMs = seq.Val(), now.UnixMilli()
	return nil
}

// ReadPlan reads a plane's current plan; nil without error when there is
// none (never published, or expired).
func ReadPlan(ctx context.Context, c redis.UniversalClient, plane string) (*Plan, error) {
	vals, err := c.HMGet(ctx, PlanKey(plane), "seq", "at", "body").Result()
	if err != nil {
		return nil, fmt.Errorf("read upstream plan: %w", err)
	}
	if vals[0] == nil || vals[2] == nil {
		return nil, nil
	}
	return ParsePlan(vals[0], vals[1], vals[2])
}

// ParsePlan decodes a plan read from its hash's fields seq, at and body
// (strings, as Redis returns them).
func ParsePlan(seq, at, body any) (*Plan, error) {
	s, ok1 := seq.(string)
	a, ok2 := at.(string)
	b, ok3 := body.(string)
	if !ok1 || !ok2 || !ok3 {
		return nil, fmt.Errorf("read upstream plan: fields seq, at and body must be strings")
	}
	p, err := DecodePlan([]byte(b))
	if err != nil {
		return nil, err
	}
	if _, err := fmt.Sscan(s, &p.Seq); err != nil {
		return nil, fmt.Errorf("read upstream plan: seq %q: %w", s, err)
	}
	if _, err := fmt.Sscan(a, &p.PublishedMs); err != nil {
		return nil, fmt.Errorf("read upstream plan: at %q: %w", a, err)
	}
	return p, nil
}
