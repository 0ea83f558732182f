package main

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/ferryhq/ferry/broker/natsjs"
	"github.com/ferryhq/ferry/shadow"
)

func newCompareCmd() *cobra.Command {
	var natsURL, prodStream, prodSubject, shadowStream, shadowSubject, keyFlag, since string
	var asJSON bool
	var show int
	cmd := &cobra.Command{
		Use:   "compare",
		Short: "Compare a production stream with Ferry's shadow stream: missing, extra, reordered, differing events",
		Long: `compare reads the production stream (what the old publisher sent) and the
shadow stream (what ferry relay --shadow-subject-prefix sent from the
outbox) over a window and matches their messages by a key:

  --key id             the CloudEvents id (Ferry's event id; ce-id or Nats-Msg-Id)
  --key ce:<attribute> a CloudEvents attribute or header, e.g. ce:subject
  --key json:/<ptr>    a JSON pointer into the body, e.g. json:/order_id (for an
                       old publisher that sends bare payloads)

It reports
  missing    in shadow, not in production: events the old code lost
  extra      in production, not in shadow: sent by the old code only (e.g. for
             a transaction that rolled back)
  reordered  in both, but out of the shadow's relative order (fewest moves)
  differing  in both, bodies differ (compared as JSON when both parse)
and exits 1 when any of these (or an unreadable key) is found. Give the
relay time to drain before comparing: the shadow side trails by its lag.
NATS JetStream only for now.`,
		Example: `  ferry compare --nats-url nats://127.0.0.1:4222 --production-stream ORDERS --shadow-stream SHADOW_ORDERS \
    --key json:/order_id --since 1h`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := applyEnv(cmd); err != nil {
				return err
			}
			if prodStream == "" || shadowStream == "" {
				return fmt.Errorf("--production-stream and --shadow-stream are required")
			}
			key, err := shadow.ParseKey(keyFlag)
			if err != nil {
				return fmt.Errorf("--key: %w", err)
			}
			var from time.Time
			if since != "" {
				if d, err := time.ParseDuration(since); err == nil && d > 0 {
					from = time.Now().Add(-d)
				} else if t, err := time.Parse(time.RFC3339, since); err == nil {
					from = t
				} else {
					return fmt.Errorf("--since %q: want a positive duration (1h) or an RFC 3339 time", since)
				}
			}
			ctx := cmd.Context()
			nc, err := natsjs.Connect(natsURL)
			if err != nil {
				return err
			}
			defer nc.Close()
			js, err := jetstream.New(nc)
			if err != nil {
				return fmt.Errorf("compare: jetstream: %w", err)
			}
			prod, err := shadow.ReadNATS(ctx, js, prodStream, prodSubject, from)
			if err != nil {
				return err
			}
			sh, err := shadow.ReadNATS(ctx, js, shadowStream, shadowSubject, from)
			if err != nil {
				return err
			}
			rep := shadow.Compare(prod, sh, key)
			out := cmd.OutOrStdout()
			if asJSON {
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				if err := enc.Encode(rep); err != nil {
					return err
				}
			} else {
				fmt.Fprintf(out, "key %s: production %d messages, shadow %d, duplicates %d\n", rep.Key, rep.Production, rep.Shadow, rep.Duplicates)
				for _, l := range []struct {
					name string
					keys []string
				}{{"missing (lost by the old path)", rep.Missing}, {"extra (old path only)", rep.Extra}, {"reordered", rep.Reordered}, {"differing", rep.Differing}, {"key errors", rep.KeyErrors}} {
					fmt.Fprintf(out, "%-31s %d", l.name, len(l.keys))
					for i, k := range l.keys {
						if i == show {
							fmt.Fprintf(out, " …")
							break
						}
						fmt.Fprintf(out, " %s", k)
					}
					fmt.Fprintln(out)
				}
			}
			if !rep.Clean() {
				return exitCodeError{code: 1}
			}
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&natsURL, "nats-url", "nats://127.0.0.1:4222", "NATS server")
	fl.StringVar(&prodStream, "production-stream", "", "JetStream stream the old publisher writes to (required)")
	fl.StringVar(&prodSubject, "production-subject", "", "subject filter in the production stream (default: all)")
	fl.StringVar(&shadowStream, "shadow-stream", "", "JetStream stream capturing the shadow subjects (required; may be the same stream)")
	fl.StringVar(&shadowSubject, "shadow-subject", "", `subject filter in the shadow stream, e.g. "shadow.>" (default: all)`)
	fl.StringVar(&keyFlag, "key", "id", "match by: id, ce:<attribute> or json:/<pointer>")
	fl.StringVar(&since, "since", "", "window start: a duration back from now (1h) or an RFC 3339 time (default: the whole streams)")
	fl.BoolVar(&asJSON, "json", false, "print the report as JSON")
	fl.IntVar(&show, "show", 20, "keys listed per category")
	return cmd
}
