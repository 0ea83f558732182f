// Command ferry runs Ferry's relay and operator tools.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := newRootCmd().ExecuteContext(ctx)
	if err != nil {
		var ec exitCodeError
		if errors.As(err, &ec) {
			os.Exit(ec.code)
		}
		fmt.Fprintln(os.Stderr, errorLine(err))
		os.Exit(1)
	}
}

// exitCodeError ends the process with a code after the command printed its
// own report (e.g. prove found violations).
type exitCodeError struct{ code int }

func (e exitCodeError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

// errorLine is the one line main prints for err. Library errors already
// carry their package's prefix ("ferry: …", "relay: …"); the command adds
// "ferry:" only when the message has none of its own, so nothing is said
// twice.
func errorLine(err error) string {
	msg := err.Error()
	if strings.HasPrefix(msg, "ferry: ") || strings.HasPrefix(msg, "ferry ") {
		return msg
	}
	return "ferry: " + msg
}
