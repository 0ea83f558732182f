package kafka

import (
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry"
)

// Consumer-group membership defaults: franz-go's, which are the Java
// client's. Ferry sets them explicitly so a franz-go upgrade cannot change
// them underneath.
const (
	// DefaultSessionTimeout: how long the coordinator waits for a silent
	// member before taking its partitions away (session.timeout.ms).
	DefaultSessionTimeout = 45 * time.Second
	// DefaultHeartbeatInterval: how often a member heartbeats
	// (heartbeat.interval.ms).
	DefaultHeartbeatInterval = 3 * time.Second
	// DefaultRebalanceTimeout: how long a rebalance waits for every member
	// to rejoin (rebalance.timeout.ms); a member that does not is dropped.
	DefaultRebalanceTimeout = 60 * time.Second
	// maxInstanceIDLen is Kafka's limit on group.instance.id.
	maxInstanceIDLen = 249
)

// groupConfig is the consumer-group membership part of config (consumer
// only; zero values mean the defaults above).
type groupConfig struct {
	instanceID        string
	sessionTimeout    time.Duration
	heartbeatInterval time.Duration
	rebalanceTimeout  time.Duration
	balancers         []kgo.GroupBalancer
}

// WithInstanceID makes the consumer a static member of its group
// (KIP-345, group.instance.id; consumer only). A static member that
// restarts under the same id — the same pod, the same host, the same
// ordinal — takes its partitions back at once, without a rebalance and
// without waiting for the dead process's session to expire: without it a
// SIGKILLed member keeps its partitions, and blocks every rebalance that
// starts meanwhile, until its session timeout (default 45s) runs out.
//
// The id must be stable across restarts of one process and unique among
// the group's live members: a second live consumer with the same id fences
// the first (FENCED_INSTANCE_ID). Up to 249 characters of [a-zA-Z0-9._-].
//
// Trade-off: a static member does not leave the group when it closes, so
// after a graceful stop that is not followed by a restart under the same
// id, its partitions wait for the session timeout before another member
// gets them. Scale-downs therefore cost one session timeout per removed
// instance; pick the session timeout with that in mind. Default: none
// (dynamic membership).
func WithInstanceID(id string) Option { return func(c *config) { c.group.instanceID = id } }

// WithSessionTimeout sets how long the group coordinator waits for a
// member's heartbeat before it declares the member dead and gives its
// partitions to others (session.timeout.ms; consumer only). Default 45s.
//
// Trade-off: this is the upper bound on how long a crashed member's
// partitions stall (for a static member that is not restarted, and for a
// dynamic member always). Shorter means faster takeover; but a member that
// misses heartbeats for longer than this — a GC pause, a network blip, a
// saturated host — is evicted, its partitions move, and in-flight records
// are redelivered to the new owner (duplicates the inbox absorbs, and a
// rebalance for everyone). Brokers bound it by group.min.session.timeout.ms
// (6s by default) and group.max.session.timeout.ms (30 min); a value
// outside is refused at join (INVALID_SESSION_TIMEOUT).
func WithSessionTimeout(d time.Duration) Option {
	return func(c *config) { c.group.sessionTimeout = d }
}

// WithHeartbeatInterval sets how often the consumer heartbeats to the
// coordinator (heartbeat.interval.ms; consumer only). Default 3s. It must
// be below the session timeout, and should be at most a third of it so
// that two lost heartbeats do not evict the member. A heartbeat is also how
// a member learns that a rebalance started, so a shorter interval makes
// the live members rejoin sooner, at the cost of one small request per
// interval per member.
func WithHeartbeatInterval(d time.Duration) Option {
	return func(c *config) { c.group.heartbeatInterval = d }
}

// WithRebalanceTimeout sets how long a rebalance waits for every member to
// rejoin (rebalance.timeout.ms; consumer only). Default 60s. Kafka uses the
// largest value among the members. A member that does not rejoin in time
// is dropped — and a member that died while joining never rejoins, so
// with dynamic membership a crash during a rebalance can stall the whole
// group for up to this long. Shorter means a faster recovery from that
// case; but every live member must finish its current poll batch and
// commit (the consumer blocks rebalances until the batch it polled was
// handed over) within it, or it is dropped and its records redelivered.
// Keep it above the time handle takes for one poll ([WithMaxPollRecords]).
func WithRebalanceTimeout(d time.Duration) Option {
	return func(c *config) { c.group.rebalanceTimeout = d }
}

// WithBalancers sets the group balancers in preference order (consumer
// only). Default: cooperative-sticky alone (KIP-429), so a member joining
// or leaving moves only the partitions that must move and the others keep
// being consumed during the rebalance, instead of every member revoking
// everything (eager). A group that today runs an eager balancer must
// migrate in two rolling restarts, first with
// kgo.CooperativeStickyBalancer() and the old balancer listed together,
// then with the cooperative one alone; one eager-only member downgrades
// the whole group to eager.
func WithBalancers(b ...kgo.GroupBalancer) Option {
	return func(c *config) { c.group.balancers = append([]kgo.GroupBalancer(nil), b...) }
}

// resolve fills defaults and validates; the error names the field.
func (g *groupConfig) resolve() error {
	if g.sessionTimeout == 0 {
		g.sessionTimeout = DefaultSessionTimeout
	}
	if g.heartbeatInterval == 0 {
		g.heartbeatInterval = min(DefaultHeartbeatInterval, g.sessionTimeout/3)
	}
	if g.rebalanceTimeout == 0 {
		g.rebalanceTimeout = DefaultRebalanceTimeout
	}
	if g.balancers == nil {
		g.balancers = []kgo.GroupBalancer{kgo.CooperativeStickyBalancer()}
	}
	switch {
	case len(g.instanceID) > maxInstanceIDLen:
		return &ferry.ConfigError{Field: "kafka.instance_id", Reason: fmt.Sprintf("must be at most %d characters, got %d", maxInstanceIDLen, len(g.instanceID))}
	case !validInstanceID(g.instanceID):
		return &ferry.ConfigError{Field: "kafka.instance_id", Reason: fmt.Sprintf("%q: only [a-zA-Z0-9._-] are allowed", g.instanceID)}
	case g.sessionTimeout < 0:
		return &ferry.ConfigError{Field: "kafka.session_timeout", Reason: fmt.Sprintf("must be > 0, got %s", g.sessionTimeout)}
	case g.heartbeatInterval <= 0 || g.heartbeatInterval >= g.sessionTimeout:
		return &ferry.ConfigError{Field: "kafka.heartbeat_interval", Reason: fmt.Sprintf("must be > 0 and below the session timeout %s (at most a third of it is advised), got %s", g.sessionTimeout, g.heartbeatInterval)}
	case g.rebalanceTimeout < 0:
		return &ferry.ConfigError{Field: "kafka.rebalance_timeout", Reason: fmt.Sprintf("must be > 0, got %s", g.rebalanceTimeout)}
	case len(g.balancers) == 0:
		return &ferry.ConfigError{Field: "kafka.balancers", Reason: "at least one balancer is required"}
	}
	for i, b := range g.balancers {
		if b == nil {
			return &ferry.ConfigError{Field: "kafka.balancers", Reason: fmt.Sprintf("balancer %d is nil", i)}
		}
	}
	return nil
}

func validInstanceID(id string) bool {
	for _, r := range id {
		ok := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-'
		if !ok {
			return false
		}
	}
	return true
}

// kgoOpts are the franz-go options for the resolved membership settings.
func (g *groupConfig) kgoOpts() []kgo.Opt {
	opts := []kgo.Opt{
		kgo.SessionTimeout(g.sessionTimeout),
		kgo.HeartbeatInterval(g.heartbeatInterval),
		kgo.RebalanceTimeout(g.rebalanceTimeout),
		kgo.Balancers(g.balancers...),
	}
	if g.instanceID != "" {
		opts = append(opts, kgo.InstanceID(g.instanceID))
	}
	return opts
}
