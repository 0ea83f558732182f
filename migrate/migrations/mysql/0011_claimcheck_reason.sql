-- A new park reason: claimcheck (an offloaded payload missing or failing
-- its size/digest check, inbox.WithClaimCheck). 0010 added the CHECK as a
-- named table constraint, which both MariaDB and MySQL 8 drop by name. A
-- re-run after a crash between the two statements finds none to drop.
SET @parked_tbl = REPLACE('{{.T "inbox_parked"}}', '`', '');
SET @parked_db = IF(LOCATE('.', @parked_tbl) > 0, SUBSTRING_INDEX(@parked_tbl, '.', 1), DATABASE());
SET @parked_chk = (SELECT tc.CONSTRAINT_NAME FROM information_schema.TABLE_CONSTRAINTS tc
    WHERE tc.TABLE_SCHEMA = @parked_db AND tc.TABLE_NAME = '{{.Bare "inbox_parked"}}' AND tc.CONSTRAINT_TYPE = 'CHECK'
      AND tc.CONSTRAINT_NAME = REPLACE('{{.I "inbox_parked_reason_check"}}', '`', '') LIMIT 1);
SET @parked_sql = IF(@parked_chk IS NULL, 'DO 0', CONCAT('ALTER TABLE {{.T "inbox_parked"}} DROP CONSTRAINT `', @parked_chk, '`'));
PREPARE parked_stmt FROM @parked_sql;
EXECUTE parked_stmt;
DEALLOCATE PREPARE parked_stmt;
ALTER TABLE {{.T "inbox_parked"}} ADD CONSTRAINT {{.I "inbox_parked_reason_check"}}
    CHECK (reason IN ('gap', 'schema', 'unauthorized', 'poison', 'collision', 'undecodable', 'decrypt', 'claimcheck'));
