package cdc_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/broker/kafka"
	"github.com/ferryhq/ferry/broker/natsjs"
	"github.com/ferryhq/ferry/relay/cdc"
)

// Configuration is validated by New, before anything connects: errors name
// the field and the limit.
func ExampleNew() {
	// Any broker.Publisher; the Kafka one connects lazily, so this example
	// needs no server (New never connects either).
	pub, err := kafka.NewPublisher([]string{"127.0.0.1:9092"})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pub.Close()

	_, err = cdc.New("postgres://app@localhost/app", pub, cdc.WithSlotName("Ferry-CDC"))
	var ce *ferry.ConfigError
	fmt.Println(errors.As(err, &ce), ce.Field)

	r, err := cdc.New("postgres://app@localhost/app", pub,
		cdc.WithSlotName("orders_cdc"), cdc.WithPublicationName("orders_outbox"),
		cdc.WithTables(ferry.Tables{Schema: "orders"}))
	fmt.Println(err)
	st := r.Status()
	fmt.Println(st.Role, st.Slot, st.Publication)
	// Output:
	// true slot_name
	// <nil>
	// stopped orders_cdc orders_outbox
}

// Running the relay: one per outbox table and deployment is enough; start
// a second one on the same slot for fail-over (it waits as standby).
func ExampleRelay_Run() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	pub, err := natsjs.DialPublisher(os.Getenv("NATS_URL"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return
	}
	defer pub.Close()
	r, err := cdc.New(os.Getenv("DATABASE_URL"), pub,
		cdc.WithSlotName("ferry_cdc"),
		cdc.WithLogger(slog.Default()),
		cdc.WithRegisterer(prometheus.DefaultRegisterer),
		cdc.WithHeartbeat(10*time.Second),
		cdc.WithLagAlert(1<<30, 5*time.Minute))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return
	}
	go func() {
		for range time.Tick(time.Minute) {
			st := r.Status()
			slog.Info("cdc", "role", st.Role, "confirmed", st.ConfirmedLSN, "lag_bytes", st.LagBytes)
		}
	}()
	if err := r.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
	}
}
