package inbox

import (
	"crypto/sha256"
	"encoding/binary"
	"strconv"

	"github.com/ferryhq/ferry"
)

// fingerprintVersion is mixed into every fingerprint so a future change of
// the canonical form cannot silently match old rows.
const fingerprintVersion = "ferry.inbox.fp.v1"

// Fingerprint returns the SHA-256 over the canonical envelope of ev plus
// its payload: event id, tenant, aggregate type/id/seq, event type, schema
// version, content type and payload, each length-prefixed so no two
// different envelopes share an encoding. Headers (trace, provenance),
// topic, shard and times are excluded: they may legitimately differ
// between deliveries of one event (a relay re-stamping trace context), and
// none of them changes what the event means.
//
// Two deliveries with the same (tenant, event id) and the same fingerprint
// are duplicates; with different fingerprints they are a collision.
func Fingerprint(ev ferry.Event) [32]byte {
	h := sha256.New()
	var lenBuf [binary.MaxVarintLen64]byte
	field := func(b []byte) {
		n := binary.PutUvarint(lenBuf[:], uint64(len(b)))
		_, _ = h.Write(lenBuf[:n])
		_, _ = h.Write(b)
	}
	field([]byte(fingerprintVersion))
	field([]byte(ev.ID.String()))
	field([]byte(ev.TenantID))
	field([]byte(ev.AggregateType))
	field([]byte(ev.AggregateID))
	field([]byte(strconv.FormatInt(ev.AggregateSeq, 10)))
	field([]byte(ev.EventType))
	field([]byte(strconv.Itoa(ev.SchemaVersion)))
	field([]byte(ev.ContentType))
	field(ev.Payload)
	var out [32]byte
	h.Sum(out[:0])
	return out
}
