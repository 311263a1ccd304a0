#!/usr/bin/env bash
# Is every process of the test cluster alive and answering? One line per component:
#
#   tests/cluster/health.sh status [component...]  # "<component> ok|down|unhealthy <detail>";
#                                                  # exit 0 iff all (or those named) are ok
#   tests/cluster/health.sh reap [grace-s]  # kill components alive but not answering
#                                           # for grace-s (default 20) so up.sh starts them afresh
#
# Components: the kwok control plane (etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, kwok-controller; pid files kwokctl keeps), the KubeRay operator
# and, unless ENVPOOL_CLUSTER_REAL_NODE=0, the real node (containerd, kubelet,
# kube-proxy, CoreDNS and the API-server relay for pods). "down" is a dead or
# missing pid; "unhealthy" a live pid whose health endpoint does not answer.
# up.sh calls both (reap, then status to decide whether to reuse the cluster) and
# the e2e fixtures call status between modules and when a test fails, so a
# harness failure never reads as a product failure.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

KWOK_CLUSTER_DIR="$KWOK_WORKDIR/clusters/$CLUSTER_NAME"
REAL_NODE="${ENVPOOL_CLUSTER_REAL_NODE:-1}"

# kwokctl names a pid file after the component
kwok_pidfile() { echo "$KWOK_CLUSTER_DIR/pids/$1.pid"; }

components() {
  echo etcd kube-apiserver kube-controller-manager kube-scheduler kwok-controller ray-operator
  [ "$REAL_NODE" = 1 ] && echo containerd kubelet kube-proxy coredns apiserver-relay
  return 0
}

pidfile() {
  case $1 in
    etcd|kube-apiserver|kube-controller-manager|kube-scheduler|kwok-controller) kwok_pidfile "$1" ;;
    ray-operator) echo "$OPERATOR_PID" ;;
    *) echo "$NODE_DIR/$1.pid" ;;
  esac
}

# the loopback TCP ports a process listens on (kwokctl picks them; no config parsing)
listen_ports() {
  ss -Hltnp 2>/dev/null | awk -v p="pid=$1," 'index($0, p) {n = split($4, a, ":"); print a[n]}' | sort -un
}

# any of the process's ports answers GET <path> with 2xx (http or https, no client cert)
probe_ports() { # pid path
  local port scheme
  for port in $(listen_ports "$1"); do
    for scheme in https http; do
      curl -ksf --max-time 2 -o /dev/null "$scheme://127.0.0.1:$port$2" 2>/dev/null && return 0
    done
  done
  return 1
}

# exit 0 if the component's own health endpoint answers
answers() { # component pid
  case $1 in
    etcd) probe_ports "$2" /health ;;
    kube-apiserver) apiserver_ready ;;
    kube-controller-manager|kube-scheduler|kwok-controller) probe_ports "$2" /healthz ;;
    ray-operator) operator_ready ;;
    containerd) ctr --address "$NODE_DIR/containerd/containerd.sock" version >/dev/null 2>&1 ;;
    kubelet) curl -fsS --max-time 2 -o /dev/null http://127.0.0.1:10248/healthz 2>/dev/null ;;
    # kube-proxy's /healthz turns 503 while a rule sync is pending; /livez is "process serves"
    kube-proxy) curl -fsS --max-time 2 -o /dev/null http://127.0.0.1:10256/livez 2>/dev/null ;;
    coredns) curl -fsS --max-time 2 -o /dev/null http://127.0.0.1:18181/ready 2>/dev/null ;;
    apiserver-relay) ss -Hltn "sport = :$(api_port)" 2>/dev/null | grep -q "$NODE_IP" ;;
  esac
}

api_port() { sed -n 's#^ *server: https://[^:]*:\([0-9]*\).*#\1#p' "$KUBECONFIG_PATH" 2>/dev/null | head -n1; }

# one line: "<component> ok|down|unhealthy <detail>"
check() {
  local c=$1 f pid
  f=$(pidfile "$c")
  if [ ! -f "$f" ]; then echo "$c down no pid file ($f)"; return 1; fi
  pid=$(cat "$f")
  if ! pid_running "$pid"; then echo "$c down pid $pid is gone"; return 1; fi
  if ! answers "$c" "$pid"; then echo "$c unhealthy pid $pid alive, health endpoint not answering"; return 1; fi
  echo "$c ok pid $pid"
}

cmd_status() {
  local c rc=0 names=("$@")
  if [ ! -d "$KWOK_CLUSTER_DIR" ]; then echo "cluster $CLUSTER_NAME down: no kwokctl cluster in $KWOK_CLUSTER_DIR"; return 1; fi
  [ ${#names[@]} -gt 0 ] || read -r -a names <<<"$(components | tr '\n' ' ')"
  for c in "${names[@]}"; do check "$c" || rc=1; done
  return $rc
}

# A live process that stops answering (hung, wedged on a lost connection) is killed
# after a grace period, so up.sh's start paths start it again. A slow API server
# under load is given the same grace before anything is killed.
cmd_reap() {
  local grace=${1:-20} c f deadline
  for c in $(components); do
    f=$(pidfile "$c")
    pidfile_running "$f" || continue
    answers "$c" "$(cat "$f")" && continue
    deadline=$(( $(date +%s) + grace ))
    while [ "$(date +%s)" -lt "$deadline" ] && ! answers "$c" "$(cat "$f")"; do sleep 1; done
    answers "$c" "$(cat "$f")" && continue
    log "$c (pid $(cat "$f")) alive but not answering for ${grace}s: killing it to restart it"
    kill -9 "$(cat "$f")" 2>/dev/null || true
  done
}

case "${1:-}" in
  status) shift; cmd_status "$@" ;;
  reap) cmd_reap "${2:-20}" ;;
  *) echo "usage: $0 status|reap [grace-seconds]" >&2; exit 2 ;;
esac
