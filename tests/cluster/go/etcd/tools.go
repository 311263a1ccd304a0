//go:build tools

// Package tools pins the commands built by tests/cluster/build.sh.
package tools

import (
	_ "go.etcd.io/etcd/server/v3"
)
