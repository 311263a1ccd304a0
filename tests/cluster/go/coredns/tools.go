//go:build tools

// Package tools pins CoreDNS, the test cluster's DNS (built by tests/cluster/build.sh).
package tools

import (
	_ "github.com/coredns/coredns"
)
