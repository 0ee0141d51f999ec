package lua

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// Publish stores the next version of a plane's policy and announces it; see
// publish.lua for its contract. RunPublish is its typed form.
var Publish = load("publish.lua")

// PublishOutcome says what one call of Publish did.
type PublishOutcome int

const (
	// PublishConflict: the caller's version was not base + 1 (base: the
	// current version or the floor, whichever is higher); nothing changed
	// and the reply's version is base.
	PublishConflict PublishOutcome = -1
	// PublishUnchanged: the current version already has this content.
	PublishUnchanged PublishOutcome = 0
	// PublishStored: the encoding is stored as the reply's version, which is
	// now current, and the notice is published.
	PublishStored PublishOutcome = 1
)

func (o PublishOutcome) String() string {
	switch o {
	case PublishConflict:
		return "conflict"
	case PublishUnchanged:
		return "unchanged"
	case PublishStored:
		return "stored"
	}
	return fmt.Sprintf("PublishOutcome(%d)", int(o))
}

// PublishArgs are the arguments of one call of Publish.
type PublishArgs struct {
	Hash     string // content hash of the policy
	Encoding []byte // the policy encoded as Version
	Version  int64  // the version Encoding carries: max(current, Floor) + 1
	Keep     int    // how many versions to keep, >= 1
	Channel  string // pub/sub channel for the notice
	// Floor is a version the stored one must exceed even when Redis holds
	// less (0: none): the caller's record of the last version it published.
	Floor int64
	// Sources, when not empty, is stored beside the version in the sources
	// field (opaque here); an empty one drops the field on a new version.
	Sources []byte
	// Signature, when not empty, is Encoding's signature, "<key id>:<...>",
	// stored as the version's sig<N> field.
	Signature string
}

// PublishReply is the reply of one call of Publish.
type PublishReply struct {
	Version int64 // the stored version, the current one, or on a conflict max(current, floor)
	Outcome PublishOutcome
}

// RunPublish calls Publish on the policy hash key with a's arguments.
func RunPublish(ctx context.Context, c redis.Scripter, key string, a PublishArgs) (PublishReply, error) {
	vals, err := Publish.Run(ctx, c, []string{key}, a.Hash, a.Encoding, a.Keep, a.Channel, a.Version, a.Floor, a.Sources, a.Signature).Int64Slice()
	if err != nil {
		return PublishReply{}, err
	}
	return parsePublishReply(vals)
}

func parsePublishReply(vals []int64) (PublishReply, error) {
	if len(vals) != 2 {
		return PublishReply{}, fmt.Errorf("lua: publish.lua replied %v, want {version, outcome}", vals)
	}
	r := PublishReply{Version: vals[0], Outcome: PublishOutcome(vals[1])}
	switch r.Outcome {
	case PublishConflict, PublishUnchanged, PublishStored:
		return r, nil
	}
	return PublishReply{}, fmt.Errorf("lua: publish.lua replied outcome %d, want -1, 0 or 1", vals[1])
}
