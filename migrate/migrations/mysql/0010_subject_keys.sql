-- Payload encryption and erasure: see the Postgres file.
CREATE TABLE {{.T "subject_keys"}} (
    key_id         VARCHAR(64)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL PRIMARY KEY,
    tenant_id      VARCHAR(128) NOT NULL,
    subject        VARCHAR(255) NOT NULL,
    subject_digest CHAR(64)     CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    kek_id         VARCHAR(64)  NOT NULL,
    wrapped_key    VARBINARY(1024) NULL,
    created_at     DATETIME(6)  NOT NULL,
    erased_at      DATETIME(6)  NULL,
    CHECK ((erased_at IS NULL) = (wrapped_key IS NOT NULL))
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
CREATE UNIQUE INDEX {{.I "subject_keys_subject_key"}} ON {{.T "subject_keys"}} (tenant_id, subject);
CREATE INDEX {{.I "subject_keys_digest_idx"}} ON {{.T "subject_keys"}} (tenant_id, subject_digest);

-- The new park reason decrypt. 0003 declared the CHECK on the column.
-- MariaDB keeps it with the column (redefining the column drops it; DROP
-- CONSTRAINT cannot); MySQL 8 made it a table constraint <table>_chk_1,
-- found by its clause in the table's database and dropped. A re-run after
-- a crash finds and drops the replacement instead, then adds it again.
ALTER TABLE {{.T "inbox_parked"}} MODIFY reason VARCHAR(16) NOT NULL;
SET @parked_tbl = REPLACE('{{.T "inbox_parked"}}', '`', '');
SET @parked_db = IF(LOCATE('.', @parked_tbl) > 0, SUBSTRING_INDEX(@parked_tbl, '.', 1), DATABASE());
SET @parked_chk = (SELECT tc.CONSTRAINT_NAME FROM information_schema.TABLE_CONSTRAINTS tc
    JOIN information_schema.CHECK_CONSTRAINTS cc ON cc.CONSTRAINT_SCHEMA = tc.CONSTRAINT_SCHEMA AND cc.CONSTRAINT_NAME = tc.CONSTRAINT_NAME
    WHERE tc.TABLE_SCHEMA = @parked_db AND tc.TABLE_NAME = '{{.Bare "inbox_parked"}}' AND tc.CONSTRAINT_TYPE = 'CHECK'
      AND cc.CHECK_CLAUSE LIKE '%undecodable%' LIMIT 1);
SET @parked_sql = IF(@parked_chk IS NULL, 'DO 0', CONCAT('ALTER TABLE {{.T "inbox_parked"}} DROP CONSTRAINT `', @parked_chk, '`'));
PREPARE parked_stmt FROM @parked_sql;
EXECUTE parked_stmt;
DEALLOCATE PREPARE parked_stmt;
ALTER TABLE {{.T "inbox_parked"}} ADD CONSTRAINT {{.I "inbox_parked_reason_check"}}
    CHECK (reason IN ('gap', 'schema', 'unauthorized', 'poison', 'collision', 'undecodable', 'decrypt'));
