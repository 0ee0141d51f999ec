// Package lua holds quotaplane's Redis scripts, one embedded .lua file each,
// and their Go wrappers. Every script starts with a header that states its
// KEYS, ARGV, return value, side effects and complexity; scripts are never
// built from strings at run time.
//
// The bucket code the scripts that keep a plane's levels share (decide,
// peek, refund, debit, reconcile) is written once, in bucket.lua: reading a
// bucket and rescaling it to the period in force, writing it with its
// expiry, reading a sliding window, the clock. It is composed in front of
// each of them when the package loads (load), and the SHA-1 a script is
// called by is the composed text's; the files themselves are fixed.
//
// Calls are typed: Levels collects a call's keys (pkg/keyspace names them)
// and their limit records, and DecideCall, PeekCall, RefundCall and
// DebitCall make a script's arguments from them.
//
// Scripts are called by SHA-1 (EVALSHA) and recover from NOSCRIPT, in
// pipelines too (Script.Run, Script.RunPipelined). All keys of one call
// share a hash tag, so every call touches one Redis Cluster slot.
package lua
