package inbox

// WithClaimCheck opens payloads the producer offloaded with
// outbox.WithClaimCheck; *claimcheck.Store implements the interface (its
// Open returns an event that is not a reference unchanged). The blob is
// fetched and its size and SHA-256 digest verified before decryption
// (WithDecryption), the contract check and the handler, which see the
// original payload and content type. What the inbox stores keeps the
// reference as delivered. A missing blob or a digest mismatch goes
// through the dedup claim and the cursor like any message, and one that
// would apply has its claim undone and is parked with reason claimcheck,
// never dropped; it is replayable once the blob is back. With it the
// optimistic batch pass is off. Off by default.
func WithClaimCheck(f PayloadOpener) Option {
	return func(c *config) { c.fetcher = f; c.alwaysSavepoints = true }
}
