package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/ferryhq/ferry/ops"
)

// maskFlag is --mask FILE: the field mask every payload Ferry shows goes
// through (ops.MaskPolicy; docs/CONSOLE.md, Masking). One flag for every
// command that builds Ops: ferry console, ferry mcp and the operator
// commands (status, evidence, ...).
type maskFlag struct {
	file string
}

func (m *maskFlag) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&m.file, "mask", "", `field mask file (YAML: event type or "*" → JSON paths such as $.customer.email): `+
		`masked values show as ***, a non-JSON payload of a masked type is withheld (env FERRY_MASK)`)
}

// options loads the file; an error names the flag and the bad entry.
func (m *maskFlag) options() ([]ops.Option, error) {
	if m.file == "" {
		return nil, nil
	}
	p, err := ops.LoadMaskPolicy(m.file)
	if err != nil {
		return nil, fmt.Errorf("--mask: %w", err)
	}
	return []ops.Option{ops.WithMask(p)}, nil
}
