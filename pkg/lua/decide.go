package lua

// Decide is decide.lua: a batch of requests decided against every level of
// the hierarchy and the burst pool in one atomic call.
var Decide = load("decide.lua", bucketLua)

// The shape of a Decide call; decide.lua's header is the contract
// (TestDecideShape checks that both agree).
const (
	// DecideRequestFields is the little-endian int64 of each request's
	// record in ARGV[3]: cost, reserve, may borrow, the four levels' key
	// indexes, the group and the index of the tenant's share bucket.
	DecideRequestFields = 9
	// DecideReplyFields is each request's share of the reply, after the
	// reply's first element (the time the script decided at).
	DecideReplyFields = 7
	// RefundRecordFields is the little-endian int64 of each record of a
	// Refund call (ARGV[3]): LevelFields, then the tokens to give back.
	RefundRecordFields = LevelFields + 1
	// DebitRecordFields is the little-endian int64 of each record of a
	// Debit call (ARGV[2]): LevelFields, then the tokens to debit.
	DebitRecordFields = LevelFields + 1
	// ReconcileRecordFields is the little-endian int64 of each lower
	// level's record of a Reconcile call (ARGV[11]): LevelFields, the
	// tokens the node admitted there and its demand there (thousandths of
	// a token per second).
	ReconcileRecordFields = LevelFields + 2
	// ClaimPoints is the water levels of each claim curve a Reconcile call
	// takes and returns (ARGV[13]): little-endian float64 each.
	ClaimPoints = 64
)

// Algorithms of a level, as Decide takes them.
const (
	AlgorithmNone          = 0
	AlgorithmTokenBucket   = 1
	AlgorithmSlidingWindow = 2
	// AlgorithmShareBucket paces a tenant at its fair share: a token
	// bucket that admits from min(cost, burst) into debt and starts with
	// what its first request needs (decide.lua's header).
	AlgorithmShareBucket = 3
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
	// ReasonShare: the global level, contended, and the tenant above its
	// weighted fair share (its share bucket is empty).
	ReasonShare
)

// Refund is refund.lua: what Decide debited for the part of a group that
// one shard admitted and another denied, given back.
var Refund = load("refund.lua", bucketLua)

// Heartbeat is heartbeat.lua: a node's heartbeat, answered with the number
// of live nodes and, with a demand report, the live nodes' reports.
var Heartbeat = load("heartbeat.lua")

// Debit is debit.lua: tokens a node admitted on its own, debited from the
// fleet's buckets.
var Debit = load("debit.lua", bucketLua)

// Reconcile is reconcile.lua: a node's push of what it admitted and pull of
// the fleet's view, in local-reconciled mode.
var Reconcile = load("reconcile.lua", bucketLua)

// Upstream is upstream.lua: an enforcer's exchange with the fleet about a
// plane's degraded upstreams (the fleet's demand per class; the plan is
// read apart).
var Upstream = load("upstream.lua")
