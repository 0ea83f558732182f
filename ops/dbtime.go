package ops

import (
	"database/sql/driver"
	"fmt"
	"strings"
	"time"
)

// nullTime scans a timestamp that may be NULL and, on SQLite, may arrive as
// text: an aggregate such as min(created_at) loses the column's declared
// type there, so the driver hands back the stored string.
type nullTime struct {
	Time  time.Time
	Valid bool
}

var timeLayouts = []string{
	"2006-01-02 15:04:05.999999999-07:00",
	"2006-01-02 15:04:05.999999999Z07:00",
	"2006-01-02T15:04:05.999999999Z07:00",
	"2006-01-02 15:04:05.999999999",
	"2006-01-02T15:04:05.999999999",
}

// Scan implements sql.Scanner.
func (n *nullTime) Scan(src any) error {
	switch v := src.(type) {
	case nil:
		*n = nullTime{}
		return nil
	case time.Time:
		*n = nullTime{Time: v.UTC(), Valid: true}
		return nil
	case []byte:
		return n.parse(string(v))
	case string:
		return n.parse(v)
	default:
		return fmt.Errorf("ops: cannot scan %T into a time", src)
	}
}

func (n *nullTime) parse(s string) error {
	s = strings.TrimSpace(s)
	for _, l := range timeLayouts {
		if t, err := time.Parse(l, s); err == nil {
			*n = nullTime{Time: t.UTC(), Valid: true}
			return nil
		}
	}
	return fmt.Errorf("ops: unrecognised time %q", s)
}

// Value implements driver.Valuer (unused by ops; keeps the type symmetric).
func (n nullTime) Value() (driver.Value, error) {
	if !n.Valid {
		return nil, nil
	}
	return n.Time, nil
}

// ptr returns the time or nil.
func (n nullTime) ptr() *time.Time {
	if !n.Valid {
		return nil
	}
	t := n.Time
	return &t
}

// age is now - t in seconds, 0 when t is not valid or in the future.
func (n nullTime) age(now time.Time) float64 {
	if !n.Valid || n.Time.After(now) {
		return 0
	}
	return now.Sub(n.Time).Seconds()
}
