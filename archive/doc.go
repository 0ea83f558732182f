// Package archive keeps a copy of the rows Ferry's cleanup deletes, in a
// blob store, and reads it back.
//
// A [Store] is an [github.com/ferryhq/ferry/ops.Archiver]: put it in
// [github.com/ferryhq/ferry/ops.CleanupOptions].Archive and every cleanup
// batch is written as one gzip-compressed NDJSON object plus a JSON
// [Manifest] (table, dialect, schema and Ferry version, row count, id range,
// size, sha256), each written with a ContentMD5, closed and read back byte
// for byte before cleanup deletes the batch's rows. A batch whose archive is
// not confirmed is not deleted.
//
//	st, err := archive.Open(ctx, "file:///var/lib/ferry/archive?create_dir=1")
//	…
//	res, err := o.Cleanup(ctx, ops.CleanupOptions{Retention: 8 * 24 * time.Hour, Archive: st}, approval)
//
// [Store.Verify] re-reads every object and checks it against its manifest;
// [Store.Batches] yields the verified batches for
// [github.com/ferryhq/ferry/ops.Ops.RestoreArchive], which writes them back
// (idempotently) into Ferry's tables of any database and dialect.
//
// URLs are gocloud.dev/blob URLs. This package links the file:// and mem://
// drivers only; for S3, GCS or Azure blank-import gocloud.dev/blob/s3blob,
// gcsblob or azureblob in your main package. Package ops defines the
// Archiver interface and links none of this. See docs/ARCHIVE.md.
package archive
