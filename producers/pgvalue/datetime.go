package pgvalue

import "strconv"

const (
	msPerDay = 24 * 60 * 60 * 1000
	usPerSec = 1_000_000
)

// appendTimestamp appends a timestamp or timestamptz in ISO DateStyle
// ("2024-01-02 03:04:05.678901", then for timestamptz an offset "+05:30",
// "-08" or "+00:53:28", then " BC" for years before 1) as fractional
// milliseconds since the Unix epoch, exact to the microsecond. A timestamp
// without time zone is read as UTC.
func appendTimestamp(dst []byte, s []byte, tz bool) ([]byte, bool) {
	if d, ok := appendInfinity(dst, s); ok {
		return d, true
	}
	s, bc := cutBC(s)
	days, rest, ok := parseDate(s, bc)
	if !ok || len(rest) == 0 || rest[0] != ' ' && rest[0] != 'T' {
		return dst, false
	}
	us, rest, ok := parseClock(rest[1:])
	if !ok {
		return dst, false
	}
	if tz {
		off, r, ok := parseOffset(rest)
		if !ok {
			return dst, false
		}
		us -= off * usPerSec
		rest = r
	}
	if len(rest) != 0 {
		return dst, false
	}
	// Whole milliseconds and the microseconds beyond them, kept apart because
	// the latest timestamps overflow int64 microseconds since 1970.
	ms := days*msPerDay + floorDiv(us, 1000)
	sub := us - floorDiv(us, 1000)*1000
	return appendMillis(dst, ms, sub), true
}

// appendDate appends a date as the milliseconds since the epoch of its UTC
// midnight.
func appendDate(dst []byte, s []byte) ([]byte, bool) {
	if d, ok := appendInfinity(dst, s); ok {
		return d, true
	}
	s, bc := cutBC(s)
	days, rest, ok := parseDate(s, bc)
	if !ok || len(rest) != 0 {
		return dst, false
	}
	return strconv.AppendInt(dst, days*msPerDay, 10), true
}

// appendTime appends a time or timetz as whole milliseconds since midnight
// (UTC for timetz), wrapped into [0, 24h) as zero-cache does, so "24:00:00"
// is 0. Microseconds are truncated before the offset is applied, also as
// zero-cache does; offsets are whole seconds, so the order does not matter.
func appendTime(dst []byte, s []byte, tz bool) ([]byte, bool) {
	us, rest, ok := parseClock(s)
	if !ok {
		return dst, false
	}
	ms := us / 1000
	if tz {
		off, r, ok := parseOffset(rest)
		if !ok {
			return dst, false
		}
		ms -= off * 1000
		rest = r
	}
	if len(rest) != 0 {
		return dst, false
	}
	ms = (ms%msPerDay + msPerDay) % msPerDay
	return strconv.AppendInt(dst, ms, 10), true
}

// appendInfinity appends the infinite timestamps and dates as strings, which
// JSON can hold where it cannot hold ±Infinity.
func appendInfinity(dst []byte, s []byte) ([]byte, bool) {
	switch string(s) {
	case "infinity":
		return append(dst, `"Infinity"`...), true
	case "-infinity":
		return append(dst, `"-Infinity"`...), true
	}
	return dst, false
}

// appendMillis appends ms + sub/1000, with sub in [0, 1000), as a decimal
// without trailing zeros.
func appendMillis(dst []byte, ms, sub int64) []byte {
	if ms < 0 && sub > 0 {
		// -1 ms + 999 µs is -0.001 ms.
		dst = append(dst, '-')
		ms, sub = -(ms + 1), 1000-sub
	}
	dst = strconv.AppendInt(dst, ms, 10)
	if sub == 0 {
		return dst
	}
	frac := [4]byte{'.', byte('0' + sub/100), byte('0' + sub/10%10), byte('0' + sub%10)}
	n := 4
	for frac[n-1] == '0' {
		n--
	}
	return append(dst, frac[:n]...)
}

// cutBC removes a trailing " BC" era.
func cutBC(s []byte) ([]byte, bool) {
	if n := len(s); n >= 3 && string(s[n-3:]) == " BC" {
		return s[:n-3], true
	}
	return s, false
}

// parseDate reads "YYYY-MM-DD" (the year may have more digits) at the start
// of s, and returns the days since 1970-01-01 in the proleptic Gregorian
// calendar Postgres uses.
func parseDate(s []byte, bc bool) (days int64, rest []byte, ok bool) {
	i := 0
	var year int64
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		// Postgres dates end in year 5874897; a longer year is garbage
		// and would overflow.
		if i == 7 {
			return 0, nil, false
		}
		year = year*10 + int64(s[i]-'0')
		i++
	}
	if i < 4 || len(s) < i+6 || s[i] != '-' || s[i+3] != '-' {
		return 0, nil, false
	}
	month, ok1 := twoDigits(s[i+1:])
	day, ok2 := twoDigits(s[i+4:])
	if !ok1 || !ok2 {
		return 0, nil, false
	}
	if bc {
		if year == 0 {
			return 0, nil, false
		}
		// 1 BC is astronomical year 0.
		year = 1 - year
	}
	if month < 1 || month > 12 || day < 1 || day > daysIn(year, month) {
		return 0, nil, false
	}
	return daysFromCivil(year, month, day), s[i+6:], true
}

// parseClock reads "HH:MM:SS[.ffffff]" at the start of s, returning
// microseconds since midnight. Digits past the sixth fractional one, which
// Postgres never prints, are dropped.
func parseClock(s []byte) (us int64, rest []byte, ok bool) {
	if len(s) < 8 || s[2] != ':' || s[5] != ':' {
		return 0, nil, false
	}
	h, ok1 := twoDigits(s)
	m, ok2 := twoDigits(s[3:])
	sec, ok3 := twoDigits(s[6:])
	if !ok1 || !ok2 || !ok3 || h > 24 || m > 59 || sec > 60 {
		return 0, nil, false
	}
	us = ((h*60+m)*60 + sec) * usPerSec
	s = s[8:]
	if len(s) > 0 && s[0] == '.' {
		i := 1
		scale := int64(usPerSec / 10)
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			us += int64(s[i]-'0') * scale
			scale /= 10
			i++
		}
		if i == 1 {
			return 0, nil, false
		}
		s = s[i:]
	}
	return us, s, true
}

// parseOffset reads a UTC offset "+HH", "-HH:MM" or "+HH:MM:SS" (local mean
// time of old dates) at the start of s, in seconds east of UTC.
func parseOffset(s []byte) (sec int64, rest []byte, ok bool) {
	if len(s) < 3 || s[0] != '+' && s[0] != '-' {
		return 0, nil, false
	}
	neg := s[0] == '-'
	h, ok := twoDigits(s[1:])
	if !ok {
		return 0, nil, false
	}
	sec = h * 3600
	s = s[3:]
	for unit := int64(60); unit > 0 && len(s) > 0 && s[0] == ':'; unit /= 60 {
		v, ok := twoDigits(s[1:])
		if !ok || v > 59 {
			return 0, nil, false
		}
		sec += v * unit
		s = s[3:]
	}
	if neg {
		sec = -sec
	}
	return sec, s, true
}

func twoDigits(s []byte) (int64, bool) {
	if len(s) < 2 || s[0] < '0' || s[0] > '9' || s[1] < '0' || s[1] > '9' {
		return 0, false
	}
	return int64(s[0]-'0')*10 + int64(s[1]-'0'), true
}

func daysIn(year, month int64) int64 {
	switch month {
	case 2:
		if year%4 == 0 && (year%100 != 0 || year%400 == 0) {
			return 29
		}
		return 28
	case 4, 6, 9, 11:
		return 30
	}
	return 31
}

// daysFromCivil is the days from 1970-01-01 to the given proleptic
// Gregorian date, year being astronomical (0 is 1 BC). It counts in 400-year
// eras of 146097 days, with years starting in March so that the leap day
// ends them (Howard Hinnant's algorithm).
func daysFromCivil(y, m, d int64) int64 {
	if m <= 2 {
		y--
	}
	era := floorDiv(y, 400)
	yoe := y - era*400
	doy := (153*((m+9)%12)+2)/5 + d - 1
	doe := yoe*365 + yoe/4 - yoe/100 + doy
	return era*146097 + doe - 719468
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if (a%b != 0) && (a < 0) != (b < 0) {
		q--
	}
	return q
}
