-- CDC (logical replication) exists on Postgres only; this no-op keeps the
-- migration versions of both dialects aligned.
SELECT 1;
