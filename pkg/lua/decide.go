package lua

// Decide is decide.lua: a batch of requests decided against every level of
// the hierarchy and the burst pool in one atomic call.
var Decide = load("decide.lua")

// The shape of a Decide call; decide.lua's header is the contract.
const (
	// DecideReplyFields is each request's share of the reply, after the
	// reply's first element (the time the script decided at).
	DecideReplyFields = 7
)

// Algorithms of a level, as Decide takes them.
const (
	AlgorithmNone          = 0
	AlgorithmTokenBucket   = 1
	AlgorithmSlidingWindow = 2
)

// Reasons Decide reports.
const (
	ReasonNone = iota
	ReasonGlobal
	ReasonReserve
	ReasonTenant
	ReasonTenantCeiling
	ReasonPoolDry
	ReasonEndpoint
	ReasonKey
)

// Heartbeat is heartbeat.lua: a node's heartbeat, answered with the number
// of live nodes.
var Heartbeat = load("heartbeat.lua")

// Debit is debit.lua: tokens a node admitted on its own, debited from the
// fleet's buckets.
var Debit = load("debit.lua")

// Reconcile is reconcile.lua: a node's push of what it admitted and pull of
// the fleet's view, in local-reconciled mode.
var Reconcile = load("reconcile.lua")
