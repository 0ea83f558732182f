-- Payload encryption and erasure (issue 20, package encrypt,
-- docs/ENCRYPTION.md). One data key per data subject (a customer the
-- events name), wrapped by a keyring key (kek_id). Envelopes carry the
-- opaque key_id, never the subject. `ferry erase` sets wrapped_key to NULL
-- and replaces subject by 'erased:' || key_id: every copy of the
-- subject's payloads (outbox, broker, archive) becomes unreadable, while
-- the row stays as evidence (digest, created_at, erased_at).
CREATE TABLE {{.T "subject_keys"}} (
    key_id         text        PRIMARY KEY,
    tenant_id      text        NOT NULL,
    subject        text        NOT NULL,
    -- hex SHA-256 of tenant_id, NUL, subject: finds erased keys of a subject
    subject_digest text        NOT NULL,
    kek_id         text        NOT NULL,
    wrapped_key    bytea,
    created_at     timestamptz NOT NULL,
    erased_at      timestamptz,
    CHECK ((erased_at IS NULL) = (wrapped_key IS NOT NULL))
);
CREATE UNIQUE INDEX {{.I "subject_keys_subject_key"}} ON {{.T "subject_keys"}} (tenant_id, subject);
CREATE INDEX {{.I "subject_keys_digest_idx"}} ON {{.T "subject_keys"}} (tenant_id, subject_digest);

-- A new park reason: decrypt (a wrong, missing or erased key). The
-- column's CHECK was created unnamed in 0003; find it by its definition.
DO $$
DECLARE c name;
BEGIN
    FOR c IN SELECT conname FROM pg_constraint
        WHERE conrelid = '{{.T "inbox_parked"}}'::regclass AND contype = 'c'
          AND pg_get_constraintdef(oid) LIKE '%undecodable%' AND pg_get_constraintdef(oid) LIKE '%reason%'
    LOOP
        EXECUTE format('ALTER TABLE %s DROP CONSTRAINT %I', '{{.T "inbox_parked"}}', c);
    END LOOP;
END $$;
ALTER TABLE {{.T "inbox_parked"}} ADD CONSTRAINT {{.I "inbox_parked_reason_check"}}
    CHECK (reason IN ('gap', 'schema', 'unauthorized', 'poison', 'collision', 'undecodable', 'decrypt'));
