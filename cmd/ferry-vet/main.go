// Command ferry-vet runs Ferry's dual-write analyzer under go vet:
//
//	go install github.com/ferryhq/ferry/cmd/ferry-vet
//	go vet -vettool=$(which ferry-vet) ./...
//
// It reports a broker publish in a function that also writes to a database
// outside a Ferry outbox (see package vet/dualwrite for what is matched and
// the precision limits). `ferry vet ./...` runs the same analyzer without go
// vet.
package main

import (
	"golang.org/x/tools/go/analysis/unitchecker"

	"github.com/ferryhq/ferry/vet/dualwrite"
)

func main() { unitchecker.Main(dualwrite.Analyzer) }
