package store

import "testing"

func TestWatcherDecisions(t *testing.T) {
	none := head{}
	v1a, v1b, v2a, v3c := head{1, "a"}, head{1, "b"}, head{2, "a"}, head{3, "c"}
	for _, tc := range []struct {
		name                       string
		delivered, skipped, reread head
		wants, reset               bool
	}{
		{"first version", none, none, v1a, true, false},
		{"same as delivered", v1a, none, v1a, false, false},
		{"newer version", v1a, none, v2a, true, false},
		{"newer version, same content", v1a, none, v2a, true, false},
		{"skipped corrupt version", v1a, v2a, v2a, false, false},
		{"newer than the skipped one", v1a, v2a, v3c, true, false},
		{"older version: reset", v2a, none, v1a, true, true},
		{"same version, other content: reset", v1a, none, v1b, true, true},
		{"older than the skipped one: reset", v2a, v3c, v1b, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := wants(tc.delivered, tc.skipped, tc.reread); got != tc.wants {
				t.Errorf("wants(%v, %v, %v) = %v, want %v", tc.delivered, tc.skipped, tc.reread, got, tc.wants)
			}
			if got := isReset(tc.delivered, tc.reread); got != tc.reset {
				t.Errorf("isReset(%v, %v) = %v, want %v", tc.delivered, tc.reread, got, tc.reset)
			}
		})
	}
}
