//go:build tools

// Package tools pins the commands built by tests/cluster/build.sh.
package tools

import (
	_ "sigs.k8s.io/kwok/cmd/kwok"
	_ "sigs.k8s.io/kwok/cmd/kwokctl"
)
