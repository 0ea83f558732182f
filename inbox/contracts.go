package inbox

import (
	"fmt"

	"github.com/ferryhq/ferry"
)

// ContractValidator checks a payload against the contract of its event type
// and schema version; *contract.Set implements it. An error must name where
// the payload breaks the contract and which rule, without payload values.
type ContractValidator interface {
	Validate(eventType string, schemaVersion int, payload []byte) error
}

// WithContracts parks a message whose payload violates the contract of the
// schema version it claims (see package contract), before the handler runs
// and before it is claimed: reason schema, with an error text starting
// "payload violates its contract:" and naming the JSON path and rule — so an
// operator tells it from an unsupported version ("… is not supported by this
// consumer", WithSchemas). Replayable once the producer or the contract is
// fixed. Event types without a contract pass. Off by default.
func WithContracts(v ContractValidator) Option {
	return func(c *config) { c.contracts = v }
}

// contractErr is the park reason text for ev, or nil when it passes.
func (ib *Inbox[TTx]) contractErr(ev ferry.Event) error {
	if ib.cfg.contracts == nil {
		return nil
	}
	if err := ib.cfg.contracts.Validate(ev.EventType, ev.SchemaVersion, ev.Payload); err != nil {
		return fmt.Errorf("payload violates its contract: %w", err)
	}
	return nil
}
