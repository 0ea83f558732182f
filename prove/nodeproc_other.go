//go:build !linux

package prove

import (
	"context"
	"errors"
	"sync/atomic"
)

// The cluster of node processes needs Linux (a parent-death signal,
// /proc); elsewhere nats-leader-sigkill is not available.
type procCluster struct{}

func startProcCluster([]string) (*procCluster, error) {
	return nil, errors.New("prove: nats node processes need Linux")
}

func (*procCluster) clientURL() string { return "" }

func (*procCluster) close() {}

func runLeaderSigkill(context.Context, *procCluster, *natsStream, *atomic.Int64) (string, error) {
	return "", errors.New("prove: nats node processes need Linux")
}

func needsProcCluster(st *stack, c *config) string {
	if why := needsNATSCluster(st, c); why != "" {
		return why
	}
	return "needs Linux: the cluster's node processes get a parent-death signal"
}
