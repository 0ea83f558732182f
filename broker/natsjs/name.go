package natsjs

// Name identifies the broker kind, as the Publisher's does; the inbox reports
// it as messaging.system on its spans.
func (c *Consumer) Name() string { return BrokerName }
