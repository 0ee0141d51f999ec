package enforcer

import (
	"context"
	"errors"
)

// decideAll decides a group through Redis. Not yet: the script's groups
// come in the next change.
func (b *central) decideAll(ctx context.Context, snap *snapshot, now int64, rs []Request, ds []Decision) (bool, error) {
	return false, errors.New("enforcer: DecideAll of more than one request in mode central is not implemented yet")
}
