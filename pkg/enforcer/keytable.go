package enforcer

import "iter"

// keyTable holds a tenant's api key states: most tenants use one key, and a
// map of one entry costs more than the key's state, so the first key sits
// in one and a map is made only for a second. The zero value is empty. Not
// safe for concurrent use: the tenant's lock guards it.
type keyTable struct {
	one  *keyState            // the only key, while many is nil
	many map[string]*keyState // two keys or more
}

// get is key's state, nil when it has none.
func (t *keyTable) get(key string) *keyState {
	if t.many != nil {
		return t.many[key]
	}
	if t.one != nil && t.one.key == key {
		return t.one
	}
	return nil
}

// put adds ks, whose key has no state yet.
func (t *keyTable) put(ks *keyState) {
	switch {
	case t.many != nil:
		t.many[ks.key] = ks
	case t.one == nil:
		t.one = ks
	default:
		t.many = map[string]*keyState{t.one.key: t.one, ks.key: ks}
		t.one = nil
	}
}

// remove forgets key's state.
func (t *keyTable) remove(key string) {
	switch {
	case t.many != nil:
		delete(t.many, key)
		if len(t.many) == 0 {
			t.many = nil
		}
	case t.one != nil && t.one.key == key:
		t.one = nil
	}
}

// len is how many keys have a state.
func (t *keyTable) len() int {
	if t.many != nil {
		return len(t.many)
	}
	if t.one != nil {
		return 1
	}
	return 0
}

// all is every key's state, in no order; it may remove the one it yields.
func (t *keyTable) all() iter.Seq[*keyState] {
	return func(yield func(*keyState) bool) {
		if t.many == nil {
			if t.one != nil {
				yield(t.one)
			}
			return
		}
		for _, ks := range t.many {
			if !yield(ks) {
				return
			}
		}
	}
}
