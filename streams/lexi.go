package streams

import (
	"errors"
	"fmt"
	"strconv"
)

// ErrBadWatermark reports a string that is not a LexiVersion.
var ErrBadWatermark = errors.New("bad watermark")

// Lexi encodes n as a LexiVersion: base 36 prefixed by (digit count - 1), so
// that string order equals numeric order. Watermarks are Lexi(LSN).
func Lexi(n uint64) string {
	s := strconv.FormatUint(n, 36)
	return strconv.FormatUint(uint64(len(s)-1), 36) + s
}

// ParseLexi decodes a LexiVersion made by Lexi.
func ParseLexi(s string) (uint64, error) {
	if len(s) < 2 {
		return 0, fmt.Errorf("%w: %q", ErrBadWatermark, s)
	}
	l, err := strconv.ParseUint(s[:1], 36, 8)
	if err != nil || int(l)+1 != len(s)-1 {
		return 0, fmt.Errorf("%w: %q", ErrBadWatermark, s)
	}
	n, err := strconv.ParseUint(s[1:], 36, 64)
	if err != nil || Lexi(n) != s {
		return 0, fmt.Errorf("%w: %q", ErrBadWatermark, s)
	}
	return n, nil
}
