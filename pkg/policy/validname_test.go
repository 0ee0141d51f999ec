package policy

import (
	"strings"
	"testing"
)

// TestValidNameByWords: the word-at-a-time check agrees with a byte at a
// time for every byte value at every place of names of 1 to 24 bytes, and
// for the bounds of length.
func TestValidNameByWords(t *testing.T) {
	byBytes := func(s string) bool {
		if len(s) == 0 || len(s) > MaxNameBytes {
			return false
		}
		for i := 0; i < len(s); i++ {
			if s[i] < 0x21 || s[i] > 0x7e {
				return false
			}
		}
		return true
	}
	for n := 1; n <= 24; n++ {
		for at := 0; at < n; at++ {
			for c := 0; c < 256; c++ {
				b := []byte(strings.Repeat("a", n))
				b[at] = byte(c)
				if s := string(b); ValidName(s) != byBytes(s) {
					t.Fatalf("ValidName(%q) = %v, want %v", s, ValidName(s), byBytes(s))
				}
			}
		}
	}
	for _, s := range []string{"", strings.Repeat("k", MaxNameBytes), strings.Repeat("k", MaxNameBytes+1), "\x7f\x7f\x7f\x7f\x7f\x7f\x7f\x7f", "!!!!!!!!~~~~~~~~"} {
		if ValidName(s) != byBytes(s) {
			t.Errorf("ValidName(%q) = %v, want %v", s, ValidName(s), byBytes(s))
		}
	}
}

func BenchmarkValidName(b *testing.B) {
	key := "sk-live-4f3a2b1c9d8e7f6a5b4c3d2e1f0a9b8c7d6e5f4a" // 48 bytes
	b.ReportAllocs()
	for b.Loop() {
		if !ValidName(key) {
			b.Fatal("invalid")
		}
	}
}
