//go:build tools

// Package tools pins the commands built by tests/cluster/build.sh.
package tools

import (
	_ "helm.sh/helm/v3/cmd/helm"
)
