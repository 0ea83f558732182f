//go:build !linux

package prove

import (
	"context"
	"errors"
	"time"
)

// The throwaway servers need Linux (a parent-death signal, /proc);
// elsewhere the db-crash scenarios are not available.
type tempServer struct {
	kind     string
	port     int
	node     string
	lastBoot time.Duration
}

const (
	serverPostgres = "postgres"
	serverMariaDB  = "mariadb"
	serverRabbitMQ = "rabbitmq"
)

const noTempServer = "needs Linux: the throwaway database server is run with a parent-death signal (prctl) and found in /proc"

func pgServerMissing() string      { return noTempServer }
func mariadbServerMissing() string { return noTempServer }
func rabbitServerMissing() string  { return noTempServer }

func startTempServer(context.Context, string) (*tempServer, error) {
	return nil, errors.New("prove: " + noTempServer)
}

func (p *tempServer) URL() string                 { return "" }
func (p *tempServer) start(context.Context) error { return errors.New("prove: " + noTempServer) }
func (p *tempServer) crash() error                { return errors.New("prove: " + noTempServer) }
func (p *tempServer) freeze()                     {}
func (p *tempServer) thaw()                       {}
func (p *tempServer) close()                      {}
