package main

import (
	"github.com/spf13/cobra"
)

func newBenchProduceCmd() *cobra.Command {
	return &cobra.Command{Use: "produce", Short: "producer benchmark (being written)", RunE: func(*cobra.Command, []string) error { return nil }}
}
