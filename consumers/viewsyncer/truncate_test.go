package viewsyncer

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// A close frame's reason is at most 123 bytes of valid UTF-8: a long
// message with multi-byte characters at the cut must stay valid.
func TestTruncate_CloseReason(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"short", "short"},
		{strings.Repeat("a", 122) + "é", strings.Repeat("a", 122)},
		{strings.Repeat("a", 121) + "é", strings.Repeat("a", 121) + "é"},
		{strings.Repeat("a", 121) + "日本", strings.Repeat("a", 121)},
	} {
		got := truncate(tc.in, maxCloseReason)
		if got != tc.want || !utf8.ValidString(got) || len(got) > maxCloseReason {
			t.Errorf("truncate(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
