# shellcheck shell=bash
# Shared settings for up.sh / down.sh / status. Sourced, not executed.
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$HERE/versions.env"

CACHE="${ENVPOOL_CLUSTER_CACHE:-$HOME/.cache/envpool-cluster}"
STATE="${ENVPOOL_CLUSTER_STATE:-$CACHE/state}"
CLUSTER_NAME="${ENVPOOL_CLUSTER_NAME:-envpool}"
NODE_COUNT="${ENVPOOL_CLUSTER_NODES:-4}"

KUBE_BIN="$CACHE/kubernetes-$KUBE_VERSION/bin"
ETCD_BIN="$CACHE/etcd-$ETCD_VERSION/bin"
KWOK_BIN="$CACHE/kwok-$KWOK_VERSION/bin"
KUBERAY_DIR="$CACHE/kuberay-$KUBERAY_VERSION"
HELM_BIN="$CACHE/helm-$HELM_VERSION/bin"

KUBENODE_BIN="$CACHE/kubenode-$KUBE_VERSION/bin"
COREDNS_BIN="$CACHE/coredns-$COREDNS_VERSION/bin"

KUBECTL="$KUBE_BIN/kubectl"
KWOKCTL="$KWOK_BIN/kwokctl"
KUBECONFIG_PATH="$STATE/kubeconfig"
OPERATOR_PID="$STATE/ray-operator.pid"
OPERATOR_LOG="$STATE/ray-operator.log"
OPERATOR_PORTS="$STATE/ray-operator.ports"

# The real node (node.sh). Addresses exist only on the bridge and in the pods'
# network namespaces that the harness creates on this machine.
NODE_NAME="${ENVPOOL_NODE_NAME:-envpool-real-0}"
NODE_DIR="$STATE/node"
NODE_BRIDGE=epbr0
NODE_POD_CIDR=10.244.0.0/24      # pods of the real node (host-local IPAM)
NODE_IP=10.244.0.1               # the bridge's address: kubelet, CoreDNS, node InternalIP
SERVICE_CIDR=10.96.0.0/16        # kube-apiserver --service-cluster-ip-range
DNS_IP=10.96.0.10                # Service kube-system/kube-dns -> CoreDNS on NODE_IP:53
CLUSTER_DOMAIN=cluster.local
# what a pod asks for to run on the real node (the e2e fixtures use these)
NODE_LABEL=envpool.dev/node=real
NODE_TAINT=envpool.dev/real-node=true:NoSchedule
CNI_BIN_DIR=/usr/lib/cni         # Debian's containernetworking-plugins

# kwokctl keeps its clusters, pki, pids and logs here (not in ~/.kwok)
export KWOK_WORKDIR="$STATE/kwok"
# every binary kwokctl may look for is a local file: nothing is downloaded
export KWOK_RUNTIME=binary
export KWOK_KUBE_VERSION="$KUBE_VERSION"
export KWOK_KUBE_BINARY_PREFIX="$KUBE_BIN"
export KWOK_KUBE_APISERVER_BINARY="$KUBE_BIN/kube-apiserver"
export KWOK_KUBE_CONTROLLER_MANAGER_BINARY="$KUBE_BIN/kube-controller-manager"
export KWOK_KUBE_SCHEDULER_BINARY="$KUBE_BIN/kube-scheduler"
export KWOK_KUBECTL_BINARY="$KUBECTL"
export KWOK_ETCD_BINARY="$ETCD_BIN/etcd"
export KWOK_CONTROLLER_BINARY="$KWOK_BIN/kwok"

T0=${T0:-$(date +%s)}
log() { printf '[%s %3ss] %s\n' "$(basename "$0" .sh)" "$(( $(date +%s) - T0 ))" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

kc() { "$KUBECTL" --kubeconfig "$KUBECONFIG_PATH" "$@"; }

cluster_exists() {
  [ -x "$KWOKCTL" ] && "$KWOKCTL" get clusters 2>/dev/null | grep -qx "$CLUSTER_NAME"
}

# A process is running if its pid exists and is not a zombie: a killed component
# whose parent has not reaped it yet still answers kill -0.
pid_running() {
  kill -0 "$1" 2>/dev/null || return 1
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  stat=${stat##*) }
  [ "${stat%% *}" != Z ]
}

# the pid in a pid file is running
pidfile_running() { [ -f "$1" ] && pid_running "$(cat "$1")"; }

operator_running() { pidfile_running "$OPERATOR_PID"; }

# Which cluster a long-lived client process was started against: the fingerprint of
# the cluster's CA. A process started before the cluster was recreated keeps the old
# CA and fails every request ("x509: ... kwok-ca") while its own probes say ready.
cluster_ca_id() { sha256sum "$KWOK_WORKDIR/clusters/$CLUSTER_NAME/pki/ca.crt" 2>/dev/null | cut -c1-16; }
OPERATOR_CA="$STATE/ray-operator.ca"
same_cluster() { # file-with-recorded-ca-id
  local now
  now=$(cluster_ca_id)
  [ -n "$now" ] && [ -f "$1" ] && [ "$(cat "$1")" = "$now" ]
}

operator_ready() {
  operator_running || return 1
  same_cluster "$OPERATOR_CA" || return 1
  local probe
  probe=$(awk -F= '$1=="probe" {print $2}' "$OPERATOR_PORTS" 2>/dev/null)
  [ -n "$probe" ] && curl -fsS --max-time 2 "http://127.0.0.1:$probe/readyz" >/dev/null 2>&1
}

apiserver_ready() {
  [ -f "$KUBECONFIG_PATH" ] && [ "$(kc --request-timeout=3s get --raw /readyz 2>/dev/null)" = ok ]
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

# Debian packages the harness needs (installed by the scripts, never by hand)
apt_install() {
  local missing=() p
  for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  log "apt-get install ${missing[*]}"
  # one apt at a time: .ci/run builds the images beside scripts/setup's Prometheus
  ( flock 6 && apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" ) \
    6>/tmp/envpool-apt.lock >&2 || die "apt-get install ${missing[*]} failed"
}

# flock(1) hands the command it runs its lock's fd (fd 3 of `flock FILE cmd`), and a
# daemon started from that command keeps it, and so the lock, for as long as it runs:
# a kubelet restarted by `flock /tmp/envpool-cluster.lock ... node.sh up` held every
# later flock of that file waiting. The scripts that start daemons (up.sh, node.sh)
# close what they inherited above stderr first; 255 is bash's own copy of the script.
close_inherited_fds() {
  local fd
  for fd in $(ls /proc/$$/fd); do
    case $fd in 0 | 1 | 2 | 255) ;; *) eval "exec $fd>&-" 2>/dev/null || true ;; esac
  done
}
