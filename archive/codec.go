package archive

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/ferryhq/ferry/ops"
)

// encodeRows writes rows as gzip-compressed NDJSON: one JSON object per
// row, keyed by column name. Times are RFC 3339 with nanoseconds (UTC),
// bytes are base64 (standard, padded), ints are JSON numbers, NULL is null.
func encodeRows(cols []ops.ArchiveColumn, rows [][]any) ([]byte, error) {
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	line := make(map[string]any, len(cols))
	enc := json.NewEncoder(zw)
	for r, row := range rows {
		if len(row) != len(cols) {
			return nil, fmt.Errorf("archive: row %d has %d values for %d columns", r, len(row), len(cols))
		}
		for i, c := range cols {
			v, err := encodeValue(c, row[i])
			if err != nil {
				return nil, fmt.Errorf("archive: row %d column %s: %w", r, c.Name, err)
			}
			line[c.Name] = v
		}
		if err := enc.Encode(line); err != nil { // Encode ends each object with \n
			return nil, fmt.Errorf("archive: encode row %d: %w", r, err)
		}
	}
	if err := zw.Close(); err != nil {
		return nil, fmt.Errorf("archive: compress: %w", err)
	}
	return buf.Bytes(), nil
}

func encodeValue(c ops.ArchiveColumn, v any) (any, error) {
	if v == nil {
		if !c.Nullable {
			return nil, fmt.Errorf("NULL in a NOT NULL column")
		}
		return nil, nil
	}
	switch c.Type {
	case ops.ColText, ops.ColUUID:
		if s, ok := v.(string); ok {
			return s, nil
		}
	case ops.ColInt:
		if n, ok := v.(int64); ok {
			return n, nil
		}
	case ops.ColTime:
		if t, ok := v.(time.Time); ok {
			return t.UTC().Format(time.RFC3339Nano), nil
		}
	case ops.ColBytes:
		if b, ok := v.([]byte); ok {
			return base64.StdEncoding.EncodeToString(b), nil
		}
	}
	return nil, fmt.Errorf("value of Go type %T for a %s column", v, c.Type)
}

// decodeRows reads what encodeRows wrote (data is the compressed object).
func decodeRows(cols []ops.ArchiveColumn, data []byte) ([][]any, error) {
	zr, err := gzip.NewReader(bytes.NewReader(data))
	if err != nil {
		return nil, fmt.Errorf("archive: not gzip: %w", err)
	}
	defer zr.Close()
	sc := bufio.NewScanner(zr)
	sc.Buffer(make([]byte, 64*1024), 64<<20) // a row holds at most a payload of some MiB
	var rows [][]any
	for sc.Scan() {
		d := json.NewDecoder(bytes.NewReader(sc.Bytes()))
		d.UseNumber()
		var line map[string]any
		if err := d.Decode(&line); err != nil {
			return nil, fmt.Errorf("archive: line %d: %w", len(rows)+1, err)
		}
		row := make([]any, len(cols))
		for i, c := range cols {
			raw, ok := line[c.Name]
			if !ok {
				return nil, fmt.Errorf("archive: line %d: no column %s", len(rows)+1, c.Name)
			}
			if row[i], err = decodeValue(c, raw); err != nil {
				return nil, fmt.Errorf("archive: line %d column %s: %w", len(rows)+1, c.Name, err)
			}
		}
		rows = append(rows, row)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("archive: read rows: %w", err)
	}
	if _, err := io.Copy(io.Discard, zr); err != nil { // gzip checks its CRC at EOF
		return nil, fmt.Errorf("archive: read rows: %w", err)
	}
	return rows, nil
}

func decodeValue(c ops.ArchiveColumn, raw any) (any, error) {
	if raw == nil {
		if !c.Nullable {
			return nil, fmt.Errorf("null in a NOT NULL column")
		}
		return nil, nil
	}
	switch c.Type {
	case ops.ColText, ops.ColUUID:
		if s, ok := raw.(string); ok {
			return s, nil
		}
	case ops.ColInt:
		if n, ok := raw.(json.Number); ok {
			return n.Int64()
		}
	case ops.ColTime:
		if s, ok := raw.(string); ok {
			return time.Parse(time.RFC3339Nano, s)
		}
	case ops.ColBytes:
		if s, ok := raw.(string); ok {
			return base64.StdEncoding.DecodeString(s)
		}
	default:
		return nil, fmt.Errorf("unknown column type %q", c.Type)
	}
	return nil, fmt.Errorf("JSON %T for a %s column", raw, c.Type)
}
