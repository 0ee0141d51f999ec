package lua

// Decide is decide.lua: a batch of requests decided against every level of
// the hierarchy and the burst pool in one atomic call.
var Decide = load("decide.lua")

// The shape of a Decide call; decide.lua's header is the contract.
const (
	// DecidePlaneArgs is how many ARGV come before the first request.
	DecidePlaneArgs = 9
	// DecidePlaneKeys is how many KEYS come before the first request.
	DecidePlaneKeys = 2
	// DecideRequestArgs and DecideRequestKeys are each request's share.
	DecideRequestArgs = 15
	DecideRequestKeys = 4
	// DecideReplyFields is each request's share of the reply, after the
	// reply's first element (the time the script decided at).
	DecideReplyFields = 6
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
