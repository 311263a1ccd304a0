//go:build tools

// Package tools pins the commands built by tests/cluster/build.sh.
package tools

import (
	_ "github.com/ray-project/kuberay/ray-operator"
)
