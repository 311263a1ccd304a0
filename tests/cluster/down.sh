#!/usr/bin/env bash
# Tear down what up.sh started: the KubeRay operator (pid file) and the kwok
# cluster (kwokctl delete cluster). Verifies that no process of the cluster is
# left. Safe to run when nothing is up.
#
#   tests/cluster/down.sh
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
mkdir -p "$STATE"
# one up/down at a time (parallel pytest sessions, CI + a developer)
exec 9>"$STATE/.lock"
flock 9

rc=0
# ports to verify afterwards: apiserver (from the kubeconfig) + operator
ports=()
if [ -f "$KUBECONFIG_PATH" ]; then
  p=$(sed -n 's#^ *server: https\{0,1\}://[^:]*:\([0-9]*\).*#\1#p' "$KUBECONFIG_PATH" | head -n1)
  [ -n "$p" ] && ports+=("$p")
fi
if [ -f "$OPERATOR_PORTS" ]; then
  while IFS='=' read -r _ p; do [ -n "$p" ] && ports+=("$p"); done <"$OPERATOR_PORTS"
fi

# 0. the real node first (its kubelet tears pods down through the API server)
bash "$HERE/node.sh" down || rc=1

# 1. KubeRay operator
if [ -f "$OPERATOR_PID" ]; then
  pid=$(cat "$OPERATOR_PID")
  if kill -0 "$pid" 2>/dev/null; then
    log "stopping ray-operator (pid $pid)"
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    kill -0 "$pid" 2>/dev/null && { log "ray-operator ignored SIGTERM: SIGKILL"; kill -9 "$pid" 2>/dev/null || true; }
  fi
  rm -f "$OPERATOR_PID" "$OPERATOR_PORTS"
fi

# 2. kwok cluster; remember its component pids to verify they are gone
cdir="$KWOK_WORKDIR/clusters/$CLUSTER_NAME"
pids=()
if [ -d "$cdir/pids" ]; then
  for f in "$cdir"/pids/*.pid; do [ -f "$f" ] && pids+=("$(cat "$f")"); done
fi
if cluster_exists; then
  log "kwokctl delete cluster --name $CLUSTER_NAME"
  "$KWOKCTL" delete cluster --name "$CLUSTER_NAME" --kubeconfig "$KUBECONFIG_PATH" >&2 2>&1 || rc=1
fi
rm -f "$KUBECONFIG_PATH"

# 3. verify
left=()
for p in "${pids[@]}"; do
  for _ in $(seq 1 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.2; done
  if kill -0 "$p" 2>/dev/null; then left+=("$p"); fi
done
if [ ${#left[@]} -gt 0 ]; then
  log "processes still alive after delete: ${left[*]}; killing them"
  for p in "${left[@]}"; do ps -o pid=,args= -p "$p" >&2 || true; kill -9 "$p" 2>/dev/null || true; done
  rc=1
fi
busy=()
for p in "${ports[@]}"; do
  if ss -Hltn "sport = :$p" 2>/dev/null | grep -q .; then busy+=("$p"); fi
done
if [ ${#busy[@]} -gt 0 ]; then log "ports still listening: ${busy[*]}"; rc=1; fi
if [ -d "$cdir" ]; then log "removing leftover $cdir"; rm -rf "$cdir"; fi
log "down (cluster '$CLUSTER_NAME')"
exit $rc
