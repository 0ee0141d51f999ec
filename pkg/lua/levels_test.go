package lua

import (
	"encoding/binary"
	"strings"

	"github.com/quotaplane/quotaplane/pkg/keyspace"
)

// testLevels are levels in the tests' shorthand: per level a name, "key"
// for a whole key or "key#field" for a field of a hash, and a record of
// width little-endian int64 in records: algorithm, rate, burst, period µs,
// then the script's extra int64.
func testLevels(names []string, records []byte, width int) *Levels {
	l := &Levels{}
	for i, name := range names {
		key, field, _ := strings.Cut(name, "#")
		v := func(j int) int64 { return int64(binary.LittleEndian.Uint64(records[8*(width*i+j):])) }
		var extra []int64
		for j := 4; j < width; j++ {
			extra = append(extra, v(j))
		}
		l.Add(keyspace.Level{Key: key, Field: field}, Limit{v(0), v(1), v(2), v(3)}, extra...)
	}
	return l
}
