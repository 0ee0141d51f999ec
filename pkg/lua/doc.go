// Package lua holds quotaplane's Redis scripts, one embedded .lua file each,
// and their Go wrappers. Every script starts with a header that states its
// KEYS, ARGV, return value, side effects and complexity; scripts are never
// built from strings at run time.
//
// Scripts are called by SHA-1 (EVALSHA) and recover from NOSCRIPT, in
// pipelines too (Script.Run, Script.RunPipelined). All keys of one call
// share a hash tag, so every call touches one Redis Cluster slot.
package lua
