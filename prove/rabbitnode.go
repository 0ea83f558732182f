//go:build linux

package prove

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// The throwaway RabbitMQ node of rabbitmq-node-kill: a tempServer of kind
// serverRabbitMQ. Everything it reads or writes is in its directory, and
// it listens on loopback only: AMQP on p.port, Erlang distribution on
// p.distPort, and its own epmd on p.epmdPort (the machine's epmd on 4369,
// which the machine's node is registered with, is never contacted).

// initRabbit names the node and writes its configuration files: an empty
// rabbitmq-env.conf (so /etc/rabbitmq/rabbitmq-env.conf is not read), a
// rabbitmq.conf keeping the default guest user to loopback logins, no
// advanced config and no plugins.
func (p *tempServer) initRabbit() error {
	p.node = "ferry-prove-" + randHex(4) + "@localhost"
	p.data = filepath.Join(p.dir, "mnesia")
	for name, body := range map[string]string{
		"rabbitmq-env.conf": "",
		"rabbitmq.conf":     "loopback_users.guest = true\n",
		"advanced.config":   "[].\n",
		"enabled_plugins":   "[].\n",
	} {
		if err := os.WriteFile(filepath.Join(p.dir, name), []byte(body), 0o644); err != nil {
			return fmt.Errorf("prove: temp rabbitmq: %w", err)
		}
	}
	return nil
}

// rabbitEnv is the node's environment on top of prove's. HOME is the
// node's directory, so its Erlang cookie is a new one (not the machine
// node's). RUNNING_UNDER_SYSTEMD makes the start script exec erl instead
// of running it in the background and waiting: the started process is
// beam.smp itself, which keeps the parent-death signal.
func (p *tempServer) rabbitEnv() []string {
	return []string{
		"HOME=" + p.dir,
		"RABBITMQ_CONF_ENV_FILE=" + filepath.Join(p.dir, "rabbitmq-env.conf"),
		"RABBITMQ_CONFIG_FILE=" + filepath.Join(p.dir, "rabbitmq.conf"),
		"RABBITMQ_ADVANCED_CONFIG_FILE=" + filepath.Join(p.dir, "advanced.config"),
		"RABBITMQ_ENABLED_PLUGINS_FILE=" + filepath.Join(p.dir, "enabled_plugins"),
		"RABBITMQ_NODENAME=" + p.node,
		"RABBITMQ_NODE_IP_ADDRESS=127.0.0.1",
		"RABBITMQ_NODE_PORT=" + strconv.Itoa(p.port),
		"RABBITMQ_DIST_PORT=" + strconv.Itoa(p.distPort),
		"RABBITMQ_MNESIA_BASE=" + p.data,
		"RABBITMQ_LOG_BASE=" + filepath.Join(p.dir, "log"),
		"RABBITMQ_PID_FILE=" + filepath.Join(p.dir, "rabbit.pid"),
		"RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS=-kernel inet_dist_use_interface {127,0,0,1}",
		"ERL_EPMD_PORT=" + strconv.Itoa(p.epmdPort),
		"ERL_EPMD_ADDRESS=127.0.0.1",
		"ERL_FLAGS=", "ERL_AFLAGS=", "ERL_ZFLAGS=",
		"RUNNING_UNDER_SYSTEMD=true",
	}
}

// startEpmd starts the node's own epmd on a free loopback port, in the
// foreground (not -daemon: it is prove's child, with a parent-death
// signal), and waits until it listens. It outlives the node's crashes;
// close stops it.
func (p *tempServer) startEpmd() error {
	p.stopEpmd()
	port, err := freePort()
	if err != nil {
		return err
	}
	logf, err := os.OpenFile(filepath.Join(p.dir, "epmd.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("prove: temp rabbitmq: epmd log: %w", err)
	}
	defer logf.Close()
	c := exec.Command(epmdBin(), "-port", strconv.Itoa(port), "-address", "127.0.0.1")
	c.Dir, c.Stdout, c.Stderr = p.dir, logf, logf
	c.SysProcAttr = &syscall.SysProcAttr{Credential: p.cred, Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := c.Start(); err != nil {
		return fmt.Errorf("prove: temp rabbitmq: start epmd: %w", err)
	}
	p.epmd, p.epmdPort = c, port
	_ = os.WriteFile(filepath.Join(p.dir, "epmd.pid"), []byte(strconv.Itoa(c.Process.Pid)+"\n"), 0o644)
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	for i := 0; i < 100; i++ {
		if conn, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			_ = conn.Close()
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	p.stopEpmd()
	return fmt.Errorf("prove: temp rabbitmq: epmd on port %d not listening within 5s", port)
}

func (p *tempServer) stopEpmd() {
	if p.epmd == nil || p.epmd.Process == nil {
		return
	}
	_ = p.epmd.Process.Kill()
	_ = p.epmd.Wait()
	p.epmd = nil
}

// pingRabbit logs in over AMQP and opens a channel: the node has booted
// (RabbitMQ opens its listener late in the boot, but a login proves it).
func (p *tempServer) pingRabbit(context.Context) error {
	conn, err := amqp.DialConfig(p.URL(), amqp.Config{Dial: amqp.DefaultDial(2 * time.Second)})
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	return ch.Close()
}
