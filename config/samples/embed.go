// Package samples embeds the sample plane: the quota objects of this
// directory, which are also the enforcer's default policy.
package samples

import "embed"

// FS holds the sample quota objects (*.yaml) at its top level.
//
//go:embed *.yaml
var FS embed.FS
