package natsembed

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/ferryhq/ferry/internal/ownerdir"
)

// RouteDialer stands between two cluster nodes: Route(from, to, addr)
// returns the address node from dials to reach node to's route listener
// at addr (a fault proxy's address, to cut the pair apart), or addr itself.
type RouteDialer func(from, to int, addr string) (string, error)

// Cluster is an in-process JetStream cluster of several Servers on
// loopback ports, each with its own store directory and route port. Routes
// are only the configured ones (no gossip of route addresses), so when a
// RouteDialer puts a proxy between every ordered pair, a node can be cut
// off from the others by those proxies alone.
type Cluster struct {
	Nodes []*Server
	dir   string
	plan  *ClusterPlan
}

// clusterDirPrefix names a cluster's directory under os.TempDir().
const clusterDirPrefix = "ferry-nats-cluster-"

// NodeConfig is one node of a planned cluster: everything a server needs
// to join it, as JSON so that the node can run in another process
// (RunNode) with exactly the configuration an in-process node gets.
type NodeConfig struct {
	Cluster    string   `json:"cluster"`
	ServerName string   `json:"server_name"`
	ClientPort int      `json:"client_port"`
	RoutePort  int      `json:"route_port"`
	Advertise  string   `json:"advertise,omitempty"` // cluster address gossiped to the others ("": the real one)
	Routes     []string `json:"routes"`              // host:port of every other node's route listener (or its proxy)
	StoreDir   string   `json:"store_dir"`
}

// ClientURL is the node's nats:// URL.
func (n NodeConfig) ClientURL() string {
	return "nats://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(n.ClientPort))
}

func (n NodeConfig) options() server.Options {
	routes := make([]*url.URL, 0, len(n.Routes))
	for _, r := range n.Routes {
		routes = append(routes, &url.URL{Scheme: "nats-route", Host: r})
	}
	return server.Options{
		ServerName: n.ServerName,
		Host:       "127.0.0.1",
		Port:       n.ClientPort,
		JetStream:  true,
		StoreDir:   n.StoreDir,
		NoLog:      true,
		NoSigs:     true,
		Cluster: server.ClusterOpts{
			Name: n.Cluster, Host: "127.0.0.1", Port: n.RoutePort,
			NoAdvertise: true, Advertise: n.Advertise, ConnectRetries: -1,
			PingInterval: 250 * time.Millisecond, MaxPingsOut: 3,
		},
		Routes: routes,
	}
}

// ClusterPlan is a cluster laid out but not started: its directory (held
// by this process, see internal/ownerdir), one store directory, client
// port and route port per node. StartCluster runs the nodes in process;
// a caller that wants them as processes of their own runs RunNode in each.
type ClusterPlan struct {
	Dir   string
	Nodes []NodeConfig
	lock  *os.File // ownerdir lock on Dir, held until Close
}

// ClientURL lists every node's client URL, comma-separated.
func (p *ClusterPlan) ClientURL() string {
	urls := make([]string, len(p.Nodes))
	for i, n := range p.Nodes {
		urls[i] = n.ClientURL()
	}
	return strings.Join(urls, ",")
}

// NodeByName returns the index of the node whose server name is name, or -1.
func (p *ClusterPlan) NodeByName(name string) int {
	for i, n := range p.Nodes {
		if n.ServerName == name {
			return i
		}
	}
	return -1
}

// Close removes the plan's directory (every node's store) and releases
// it. The nodes must have stopped.
func (p *ClusterPlan) Close() error {
	err := os.RemoveAll(p.Dir)
	if p.lock != nil {
		_ = p.lock.Close()
	}
	if err != nil {
		return fmt.Errorf("natsembed: remove cluster dir: %w", err)
	}
	return nil
}

// PlanCluster lays out a cluster of n (3..7) nodes named
// ferry-node-0..n-1 in cluster name: a fresh directory under
// os.TempDir() owned by this process, a store directory and two free
// loopback ports per node. dial may be nil (nodes dial each other
// directly). Directories of earlier runs whose owner died are removed
// first, and node processes still running there are SIGKILLed.
func PlanCluster(n int, name string, dial RouteDialer) (*ClusterPlan, error) {
	if n < 3 || n > 7 {
		return nil, fmt.Errorf("natsembed: StartCluster: n %d is outside 3..7", n)
	}
	if name == "" {
		return nil, errors.New("natsembed: StartCluster: name must not be empty")
	}
	// A run SIGKILLed before Close leaves its directory behind (in-process
	// nodes die with it; node processes get a parent-death signal, and
	// those that outlived it anyway are killed here): remove those of dead
	// owners, then own this one for as long as the process lives.
	ownerdir.Sweep(filepath.Join(os.TempDir(), clusterDirPrefix+"*"), killOrphanNodes)
	dir, err := os.MkdirTemp("", clusterDirPrefix+"*")
	if err != nil {
		return nil, fmt.Errorf("natsembed: cluster dir: %w", err)
	}
	p := &ClusterPlan{Dir: dir}
	if p.lock, err = ownerdir.Lock(dir); err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("natsembed: %w", err)
	}
	clientPorts, routePorts := make([]int, n), make([]int, n)
	for i := 0; i < n; i++ {
		if clientPorts[i], err = freePort(); err != nil {
			_ = p.Close()
			return nil, err
		}
		if routePorts[i], err = freePort(); err != nil {
			_ = p.Close()
			return nil, err
		}
	}
	for i := 0; i < n; i++ {
		var routes []string
		for j := 0; j < n; j++ {
			if j == i {
				continue
			}
			addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(routePorts[j]))
			if dial != nil {
				if addr, err = dial(i, j, addr); err != nil {
					_ = p.Close()
					return nil, fmt.Errorf("natsembed: route %d->%d: %w", i, j, err)
				}
			}
			routes = append(routes, addr)
		}
		// With a dialer (fault proxies between the nodes) every route must
		// go through it. A node gossips its own cluster address to the
		// others, which then dial it directly as an "implicit" route when
		// it matches no configured route — a path around the proxies that
		// heals a partition within seconds. Advertising a port nothing
		// listens on leaves the configured (proxied) routes as the only
		// ones; implicit dials fail and are dropped.
		advertise := ""
		if dial != nil {
			dead, err := freePort()
			if err != nil {
				_ = p.Close()
				return nil, err
			}
			advertise = net.JoinHostPort("127.0.0.1", strconv.Itoa(dead))
		}
		store := filepath.Join(dir, "node-"+strconv.Itoa(i))
		if err := os.MkdirAll(store, 0o700); err != nil {
			_ = p.Close()
			return nil, fmt.Errorf("natsembed: node store dir: %w", err)
		}
		p.Nodes = append(p.Nodes, NodeConfig{
			Cluster: name, ServerName: "ferry-node-" + strconv.Itoa(i),
			ClientPort: clientPorts[i], RoutePort: routePorts[i], Advertise: advertise,
			Routes: routes, StoreDir: store,
		})
	}
	return p, nil
}

// StartCluster starts n (3..7) JetStream servers named ferry-node-0..n-1
// in cluster name, in this process (PlanCluster's layout), and waits until
// JetStream's meta group has a leader. dial may be nil (nodes dial each
// other directly).
//
// The ports are found free and then bound by the nodes: another process
// may take one in between (on a busy machine, as the local port of an
// outgoing connection). Without a dialer a start that fails is retried
// on fresh ports, up to three times; with one, the caller owns what the
// dialer built and retries itself.
func StartCluster(n int, name string, dial RouteDialer) (*Cluster, error) {
	c, err := startCluster(n, name, dial)
	for try := 1; err != nil && dial == nil && try < 3 && errors.Is(err, errNotReady); try++ {
		c, err = startCluster(n, name, dial)
	}
	return c, err
}

// errNotReady marks a node that did not accept connections in time.
var errNotReady = errors.New("not ready")

func startCluster(n int, name string, dial RouteDialer) (*Cluster, error) {
	p, err := PlanCluster(n, name, dial)
	if err != nil {
		return nil, err
	}
	c := &Cluster{dir: p.Dir, plan: p}
	for _, nc := range p.Nodes {
		c.Nodes = append(c.Nodes, &Server{storeDir: nc.StoreDir, opts: nc.options()})
	}
	// Start every node before waiting on any: a JetStream cluster is not
	// ready until a majority of nodes run.
	for i, s := range c.Nodes {
		opts := s.opts
		srv, err := server.NewServer(&opts)
		if err != nil {
			_ = c.Close()
			return nil, fmt.Errorf("natsembed: node %d: %w", i, err)
		}
		srv.Start()
		s.srv = srv
	}
	for i, s := range c.Nodes {
		if !s.srv.ReadyForConnections(10 * time.Second) {
			_ = c.Close()
			return nil, fmt.Errorf("natsembed: node %d on port %d (route port %d): %w within 10s", i, s.opts.Port, s.opts.Cluster.Port, errNotReady)
		}
	}
	if err := c.WaitReady(20 * time.Second); err != nil {
		_ = c.Close()
		return nil, err
	}
	return c, nil
}

// WaitReady waits until every running node has a route to every other
// running node, sees a JetStream meta leader and is current with it.
func (c *Cluster) WaitReady(limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		var running []*server.Server
		for _, s := range c.Nodes {
			s.mu.Lock()
			if s.srv != nil {
				running = append(running, s.srv)
			}
			s.mu.Unlock()
		}
		ready := true
		for _, srv := range running {
			if !srv.JetStreamIsClustered() || !srv.JetStreamIsCurrent() || routedPeers(srv) < len(running)-1 {
				ready = false
			}
		}
		if ready {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("natsembed: cluster JetStream not ready within %s", limit)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// ClientURL lists every node's client URL, comma-separated: a NATS client
// given it connects to any node that is up and fails over between them.
func (c *Cluster) ClientURL() string {
	urls := make([]string, len(c.Nodes))
	for i, s := range c.Nodes {
		urls[i] = s.ClientURL()
	}
	return strings.Join(urls, ",")
}

// NodeByName returns the node whose server name is name (as JetStream
// reports a stream's leader), or -1.
func (c *Cluster) NodeByName(name string) int {
	for i, s := range c.Nodes {
		if s.opts.ServerName == name {
			return i
		}
	}
	return -1
}

// Close shuts every node down and removes the cluster's directory.
func (c *Cluster) Close() error {
	for _, s := range c.Nodes {
		_ = s.Close() // a node's store is under c.dir, not owned by it
	}
	return c.plan.Close()
}

// routedPeers counts the distinct servers srv has a route to (a pair may
// have several pooled route connections).
func routedPeers(srv *server.Server) int {
	rz, err := srv.Routez(&server.RoutezOptions{})
	if err != nil {
		return 0
	}
	peers := map[string]bool{}
	for _, r := range rz.Routes {
		peers[r.RemoteName] = true
	}
	return len(peers)
}
