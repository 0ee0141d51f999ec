package lua

// Peek is peek.lua: the tokens left at levels of a plane, read as decide.lua
// would see them now, without writing anything (the script is flagged
// no-writes, so Redis refuses any write it tried): the debug view of mode
// central. Its levels are Decide's.
var Peek = load("peek.lua", bucketLua)

// PeekReplyFields is each key's share of Peek's reply, after the reply's
// first element (the time it read at): the tokens left, and 1 when Redis
// holds a record for the key.
const PeekReplyFields = 2
