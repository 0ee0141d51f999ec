package enforcer

import "iter"

// keyTable holds a tenant's api key states: most tenants use one key, and a
// map of one entry costs more than the key's state, so the table is one
// pointer to its first key's state, and a map of every key's state is made
// only for a second and hangs off the first (keyState.many: a key state is
// 64 bytes with or without it). The zero value is empty. Not safe for
// concurrent use: the tenant's lock guards it.
type keyTable struct {
	head *keyState
}

// get is key's state, nil when it has none.
func (t *keyTable) get(key string) *keyState {
	h := t.head
	switch {
	case h == nil:
		return nil
	case h.many != nil:
		return h.many[key]
	case h.key == key:
		return h
	}
	return nil
}

// put adds ks, whose key has no state yet.
func (t *keyTable) put(ks *keyState) {
	h := t.head
	switch {
	case h == nil:
		t.head = ks
	case h.many == nil:
		h.many = map[string]*keyState{h.key: h, ks.key: ks}
	default:
		h.many[ks.key] = ks
	}
}

// remove forgets key's state.
func (t *keyTable) remove(key string) {
	h := t.head
	switch {
	case h == nil:
	case h.many == nil:
		if h.key == key {
			t.head = nil
		}
	default:
		many := h.many
		delete(many, key)
		if h.key == key { // the map moves to another key's state
			h.many = nil
			for _, ks := range many {
				t.head = ks
				break
			}
		}
		if len(many) > 1 {
			t.head.many = many
		} else {
			t.head.many = nil
		}
	}
}

// len is how many keys have a state.
func (t *keyTable) len() int {
	switch h := t.head; {
	case h == nil:
		return 0
	case h.many != nil:
		return len(h.many)
	}
	return 1
}

// all is every key's state, in no order; it may remove the one it yields.
func (t *keyTable) all() iter.Seq[*keyState] {
	return func(yield func(*keyState) bool) {
		h := t.head
		switch {
		case h == nil:
		case h.many == nil:
			yield(h)
		default:
			for _, ks := range h.many {
				if !yield(ks) {
					return
				}
			}
		}
	}
}
