#!/usr/bin/env bash
# The test cluster's one real node, beside the kwok nodes:
#
#   containerd (Debian) + runc  ->  kubelet (k8s.io/kubernetes, KUBE_VERSION)
#   CNI bridge $NODE_BRIDGE (bridge, host-local, portmap) with pod CIDR $NODE_POD_CIDR
#   kube-proxy (iptables) for Service CIDR $SERVICE_CIDR
#   CoreDNS (a host process on $NODE_IP:53) behind the Service kube-system/kube-dns
#
#   tests/cluster/node.sh up      # called by up.sh once the API server serves
#   tests/cluster/node.sh down    # called by down.sh: leaves no process, mount,
#                                 # netns, veth, bridge or iptables rule of ours
#   tests/cluster/node.sh check   # exit 0 if the node is up and Ready
#   tests/cluster/node.sh images  # rebuild/import the images after a source change
#
# Networking stays on this machine: pods get routes to the pod and Service CIDRs
# only (no default route), a FORWARD rule drops anything from the bridge to any
# other interface, and CoreDNS serves cluster.local only (no upstream: other
# names are REFUSED). The node is tainted $NODE_TAINT so only pods that ask for
# it (toleration + nodeSelector $NODE_LABEL) run there; the kwok nodes keep the rest.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
close_inherited_fds

ND="$NODE_DIR"
CTRD_SOCK="$ND/containerd/containerd.sock"
PKI="$KWOK_WORKDIR/clusters/$CLUSTER_NAME/pki"
CTR=(ctr --address "$CTRD_SOCK" -n k8s.io)
# containerd's content and snapshots outlive the node (like a real node's image
# cache): a warm up.sh finds the images unpacked; its state (pods) does not.
CTRD_ROOT="$CACHE/node-containerd"

pid_alive() { pidfile_running "$1"; }

start_bg() { # name cmd...  (pid in $ND/<name>.pid, log in $ND/<name>.log)
  local name=$1; shift
  setsid nohup "$@" >"$ND/$name.log" 2>&1 </dev/null 9>&- 8>&- &
  echo $! >"$ND/$name.pid"
}

stop_pid() { # name [timeout-tenths]
  local f="$ND/$1.pid" pid
  [ -f "$f" ] || return 0
  pid=$(cat "$f")
  if pid_running "$pid"; then
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 "${2:-50}"); do pid_running "$pid" || break; sleep 0.1; done
    pid_running "$pid" && { log "$1 ignored SIGTERM: SIGKILL"; kill -9 "$pid" 2>/dev/null || true; }
  fi
  rm -f "$f"
}

# Write stdin to a config file only when its content differs. kube-proxy exits on
# any write to its --config file ("content of the proxy server's configuration file
# was updated"), so rewriting the same content on every node.sh up killed it.
# Returns 0 when the file changed.
put() {
  cat >"$1.new"
  if cmp -s "$1.new" "$1"; then rm -f "$1.new"; return 1; fi
  mv "$1.new" "$1"
}

node_ready() {
  [ "$(kc get node "$NODE_NAME" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ]
}

write_configs() { # pause-image
  local pause=$1
  mkdir -p "$ND"/{containerd,cni/net.d,cni/ipam,kubelet,kube-proxy,coredns}
  put "$ND/containerd/config.toml" <<TOML || true
version = 2
root = "$CTRD_ROOT"
state = "$ND/containerd/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]
[grpc]
  address = "$CTRD_SOCK"
[plugins."io.containerd.internal.v1.opt"]
  path = "$ND/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$pause"
  # this VM forbids lowering oom_score_adj; the kubelet asks -998 for sandboxes
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  # Images are imported, never pulled: every registry resolves to a closed
  # loopback port, so a pod naming an image this node lacks fails at once
  # (ErrImagePull) instead of reaching out to a registry.
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "$ND/containerd/certs.d"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$CNI_BIN_DIR"
    conf_dir = "$ND/cni/net.d"
TOML
  mkdir -p "$ND/containerd/certs.d/_default"
  put "$ND/containerd/certs.d/_default/hosts.toml" <<TOML || true
server = "http://127.0.0.1:9"
[host."http://127.0.0.1:9"]
  capabilities = ["pull", "resolve"]
TOML
  # routes to the pod and Service CIDRs only: a pod has no way off this machine
  put "$ND/cni/net.d/10-envpool.conflist" <<JSON || true
{
  "cniVersion": "0.4.0",
  "name": "envpool",
  "plugins": [
    {"type": "bridge", "bridge": "$NODE_BRIDGE", "isGateway": true, "ipMasq": false,
     "hairpinMode": true,
     "ipam": {"type": "host-local", "dataDir": "$ND/cni/ipam",
              "ranges": [[{"subnet": "$NODE_POD_CIDR", "gateway": "$NODE_IP"}]],
              "routes": [{"dst": "$NODE_POD_CIDR"}, {"dst": "$SERVICE_CIDR"}]}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
JSON
  : >"$ND/resolv.conf"   # pods with dnsPolicy Default get no upstream either
  # a kubelet reads its --config at start only: a changed one takes a restart (its pods'
  # containers keep running through it)
  if put "$ND/kubelet/config.yaml" <<YAML; then stop_pid kubelet; fi
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# cgroup v1 controllers on this machine kind: kubelets >= 1.35 refuse them unless told
failCgroupV1: false
cgroupDriver: cgroupfs
failSwapOn: false
containerRuntimeEndpoint: unix://$CTRD_SOCK
address: $NODE_IP
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $PKI/ca.crt}
authorization: {mode: Webhook}
clusterDomain: $CLUSTER_DOMAIN
clusterDNS: [$DNS_IP]
resolvConf: $ND/resolv.conf
podCIDR: $NODE_POD_CIDR
maxPods: 40
serializeImagePulls: false
# images are imported, never pulled: do not garbage-collect them under disk pressure
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: 200Mi, nodefs.available: 2%, imagefs.available: 2%}
registerWithTaints:
- {key: ${NODE_TAINT%%=*}, value: "$(echo "${NODE_TAINT#*=}" | cut -d: -f1)", effect: ${NODE_TAINT##*:}}
nodeStatusReportFrequency: 10s
syncFrequency: 10s
shutdownGracePeriod: 0s
# Secrets and ConfigMaps of pods (volumes, env) by GET, cached per the node's ttl, not
# by a watch per object: the watch-based default gives a new watch 1 s to list
# (watch_based_manager.go) and recycles watches idle for a minute, so on a loaded
# machine a new pod's volumes failed with "failed to sync secret cache: timed out
# waiting for the condition" and waited out the mount backoff (up to 2 min each) for
# minutes; a GET has no such limit
configMapAndSecretChangeDetectionStrategy: Cache
YAML
  if put "$ND/kube-proxy/config.yaml" <<YAML; then stop_pid kube-proxy; fi
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
clientConnection: {kubeconfig: $KUBECONFIG_PATH}
hostnameOverride: $NODE_NAME
bindAddress: 127.0.0.1
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
clusterCIDR: $NODE_POD_CIDR
# NodePorts only on the node's bridge address, never on this machine's own interfaces
nodePortAddresses: [$NODE_IP/32]
conntrack: {maxPerCore: 0}
YAML
  put "$ND/coredns/Corefile" <<COREFILE || true
$CLUSTER_DOMAIN:53 in-addr.arpa:53 ip6.arpa:53 {
    bind $NODE_IP
    errors
    ready 127.0.0.1:18181
    kubernetes $CLUSTER_DOMAIN in-addr.arpa ip6.arpa {
        kubeconfig $KUBECONFIG_PATH kwok-$CLUSTER_NAME
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 5
    }
    cache 5
}
COREFILE
}

net_up() {
  if ! ip link show "$NODE_BRIDGE" >/dev/null 2>&1; then
    ip link add "$NODE_BRIDGE" type bridge
  fi
  ip addr replace "$NODE_IP/${NODE_POD_CIDR#*/}" dev "$NODE_BRIDGE"
  ip link set "$NODE_BRIDGE" up
  modprobe br_netfilter 2>/dev/null || true
  # Service DNAT must see traffic between pods on the same bridge
  [ -e /proc/sys/net/bridge/bridge-nf-call-iptables ] && sysctl -qw net.bridge.bridge-nf-call-iptables=1
  # the CNI bridge plugin turns forwarding on: remember the machine's own setting
  [ -f "$ND/ip_forward.orig" ] || cat /proc/sys/net/ipv4/ip_forward >"$ND/ip_forward.orig"
  iptables -w -N ENVPOOL-NODE 2>/dev/null || iptables -w -F ENVPOOL-NODE
  iptables -w -A ENVPOOL-NODE -i "$NODE_BRIDGE" ! -o "$NODE_BRIDGE" -j DROP \
    -m comment --comment "envpool test node: nothing from pods leaves the bridge"
  iptables -w -C FORWARD -j ENVPOOL-NODE 2>/dev/null || iptables -w -I FORWARD 1 -j ENVPOOL-NODE
}

dns_service() {
  kc apply -f - >&2 <<YAML
apiVersion: v1
kind: Service
metadata:
  name: kube-dns
  namespace: kube-system
  labels: {k8s-app: kube-dns, app.kubernetes.io/managed-by: envpool-test-node}
spec:
  clusterIP: $DNS_IP
  ports:
  - {name: dns, port: 53, protocol: UDP, targetPort: 53}
  - {name: dns-tcp, port: 53, protocol: TCP, targetPort: 53}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: kube-dns-host
  namespace: kube-system
  labels: {kubernetes.io/service-name: kube-dns, endpointslice.kubernetes.io/managed-by: envpool-test-node}
addressType: IPv4
endpoints:
- addresses: [$NODE_IP]
  conditions: {ready: true}
ports:
- {name: dns, port: 53, protocol: UDP}
- {name: dns-tcp, port: 53, protocol: TCP}
YAML
}

cmd_images() { # build what changed (image.sh) and import it; images.env names them
  local images want tar have keep
  log "images (buildah; cached by content)"
  images=$(bash "$HERE/image.sh") || die "image.sh failed"
  for tarvar in PAUSE_IMAGE_TAR ENVPOOL_IMAGE_TAR TRAINER_IMAGE_TAR REDIS_IMAGE_TAR; do
    tar=$(echo "$images" | sed -n "s/^$tarvar=//p")
    want=$(echo "$images" | sed -n "s/^${tarvar%_TAR}=//p")
    have=$("${CTR[@]}" images ls -q 2>/dev/null | grep -Fx "$want" || true)
    if [ -z "$have" ]; then
      log "importing $want into containerd ($(du -m "$tar" | cut -f1) MiB)"
      "${CTR[@]}" images import "$tar" >&2
    fi
  done
  # project images whose tar image.sh no longer keeps (it keeps the newest few, so
  # a test session that started on the previous one still finds it)
  keep=$(ls -1 "$CACHE"/images/envpool-*.tar 2>/dev/null | sed 's#.*/envpool-\(.*\)\.tar#localhost/envpool:dev-\1#')
  for old in $("${CTR[@]}" images ls -q 2>/dev/null | grep '^localhost/envpool:dev-' | grep -Fxv "$keep" || true); do
    "${CTR[@]}" images rm "$old" >/dev/null 2>&1 || true
  done
  keep=$(ls -1 "$CACHE"/images/trainer-*.tar 2>/dev/null | sed 's#.*/trainer-\(.*\)\.tar#localhost/envpool-trainer:dev-\1#')
  for old in $("${CTR[@]}" images ls -q 2>/dev/null | grep '^localhost/envpool-trainer:dev-' | grep -Fxv "$keep" || true); do
    "${CTR[@]}" images rm "$old" >/dev/null 2>&1 || true
  done
  # the sandbox image must never be pulled or garbage-collected
  "${CTR[@]}" images label "$(echo "$images" | sed -n 's/^PAUSE_IMAGE=//p')" io.cri-containerd.pinned=pinned >/dev/null 2>&1 || true
  echo "$images" >"$ND/images.env.tmp" && mv "$ND/images.env.tmp" "$ND/images.env"
}

cmd_up() {
  apt_install containerd runc containernetworking-plugins iptables conntrack socat
  [ -x "$KUBENODE_BIN/kubelet" ] && [ -x "$KUBENODE_BIN/kube-proxy" ] && [ -x "$COREDNS_BIN/coredns" ] \
    || die "kubelet/kube-proxy/coredns missing: run tests/cluster/build.sh kubenode coredns"
  local t0 pause
  t0=$(date +%s)
  mkdir -p "$ND"
  pause=$(bash "$HERE/image.sh" | sed -n 's/^PAUSE_IMAGE=//p') || die "image.sh failed"
  write_configs "$pause"
  net_up

  if ! pid_alive "$ND/containerd.pid"; then
    log "starting containerd $(containerd --version | awk '{print $3}') (socket $CTRD_SOCK)"
    start_bg containerd containerd --config "$ND/containerd/config.toml"
  fi
  for _ in $(seq 1 100); do "${CTR[@]}" version >/dev/null 2>&1 && break; sleep 0.1; done
  "${CTR[@]}" version >/dev/null 2>&1 || { tail -n 30 "$ND/containerd.log" >&2; die "containerd did not start"; }
  cmd_images
  # the node's API clients hold the cluster's CA: started against a cluster that has
  # since been recreated, they fail every request; start them again
  if ! same_cluster "$ND/cluster-ca"; then
    for c in kubelet kube-proxy coredns; do pid_alive "$ND/$c.pid" && log "$c was started against another cluster's CA: restarting"; stop_pid "$c"; done
  fi
  cluster_ca_id >"$ND/cluster-ca"
  if ! pid_alive "$ND/kubelet.pid"; then
    log "starting kubelet $KUBE_VERSION as node $NODE_NAME ($NODE_IP)"
    start_bg kubelet "$KUBENODE_BIN/kubelet" --config "$ND/kubelet/config.yaml" \
      --kubeconfig "$KUBECONFIG_PATH" --root-dir "$ND/kubelet/root" --cert-dir "$ND/kubelet/pki" \
      --hostname-override "$NODE_NAME" --node-ip "$NODE_IP" \
      --node-labels "$NODE_LABEL,envpool.dev/node-kind=real" --v 1
  fi
  if ! pid_alive "$ND/kube-proxy.pid"; then
    log "starting kube-proxy (iptables; Services $SERVICE_CIDR)"
    start_bg kube-proxy "$KUBENODE_BIN/kube-proxy" --config "$ND/kube-proxy/config.yaml" --v 1
  fi
  dns_service
  # pods reach the API server through the kubernetes Service (endpoint NODE_IP:<port>);
  # it listens on loopback only, so relay that one address and port to it
  local api_port
  api_port=$(sed -n 's#^ *server: https://[^:]*:\([0-9]*\).*#\1#p' "$KUBECONFIG_PATH" | head -n1)
  if [ -n "$api_port" ] && ! pid_alive "$ND/apiserver-relay.pid"; then
    log "relaying $NODE_IP:$api_port -> 127.0.0.1:$api_port (kubernetes Service for pods)"
    start_bg apiserver-relay socat "TCP-LISTEN:$api_port,bind=$NODE_IP,fork,reuseaddr" "TCP:127.0.0.1:$api_port"
  fi
  if ! pid_alive "$ND/coredns.pid"; then
    log "starting CoreDNS $COREDNS_VERSION on $NODE_IP:53 (Service kube-dns $DNS_IP)"
    start_bg coredns "$COREDNS_BIN/coredns" -conf "$ND/coredns/Corefile"
  fi
  for _ in $(seq 1 240); do
    node_ready && break
    pid_alive "$ND/kubelet.pid" || { tail -n 40 "$ND/kubelet.log" >&2; die "kubelet exited"; }
    sleep 0.5
  done
  node_ready || { tail -n 40 "$ND/kubelet.log" >&2; die "node $NODE_NAME not Ready after 120s"; }
  for _ in $(seq 1 60); do curl -fsS http://127.0.0.1:18181/ready >/dev/null 2>&1 && break; sleep 0.5; done
  curl -fsS http://127.0.0.1:18181/ready >/dev/null 2>&1 || { tail -n 20 "$ND/coredns.log" >&2; die "CoreDNS not ready"; }
  log "node $NODE_NAME Ready in $(( $(date +%s) - t0 ))s (image $(sed -n 's/^ENVPOOL_IMAGE=//p' "$ND/images.env"))"
}

cmd_down() {
  local rc=0
  # 1. pods: let the kubelet tear down their sandboxes (CNI DEL, unmounts)
  if pid_alive "$ND/kubelet.pid" && apiserver_ready; then
    kc delete pods -A --field-selector "spec.nodeName=$NODE_NAME" --grace-period=1 --wait=false >/dev/null 2>&1 || true
    for _ in $(seq 1 120); do
      [ -z "$("${CTR[@]}" tasks ls -q 2>/dev/null)" ] && break; sleep 0.5
    done
  fi
  stop_pid kubelet
  stop_pid coredns
  stop_pid apiserver-relay
  stop_pid kube-proxy
  if [ -x "$KUBENODE_BIN/kube-proxy" ]; then
    "$KUBENODE_BIN/kube-proxy" --cleanup --config "$ND/kube-proxy/config.yaml" >/dev/null 2>&1 || true
  fi
  # 2. whatever the kubelet did not get to: kill tasks, then containerd and its shims
  if pid_alive "$ND/containerd.pid"; then
    for t in $("${CTR[@]}" tasks ls -q 2>/dev/null); do "${CTR[@]}" tasks kill -s SIGKILL "$t" >/dev/null 2>&1 || true; done
    for _ in $(seq 1 50); do [ -z "$("${CTR[@]}" tasks ls -q 2>/dev/null)" ] && break; sleep 0.1; done
    for t in $("${CTR[@]}" tasks ls -q 2>/dev/null); do "${CTR[@]}" tasks rm -f "$t" >/dev/null 2>&1 || true; done
    # containers (and their snapshots) go; the images stay in $CTRD_ROOT
    for c in $("${CTR[@]}" containers ls -q 2>/dev/null); do "${CTR[@]}" containers rm "$c" >/dev/null 2>&1 || true; done
  fi
  stop_pid containerd
  pkill -9 -f "containerd-shim-runc-v2 .*-address $CTRD_SOCK" 2>/dev/null || true
  # 3. mounts, network namespaces, veths, the bridge, iptables, cgroups
  for d in "$ND" "$CTRD_ROOT"; do
    awk -v d="$d" 'index($2, d) == 1 {print $2}' /proc/mounts | sort -r | while read -r m; do
      umount -l "$m" 2>/dev/null || true
    done
  done
  for ns in $(ip netns list 2>/dev/null | awk '/^cni-/ {print $1}'); do ip netns del "$ns" 2>/dev/null || true; done
  if ip link show "$NODE_BRIDGE" >/dev/null 2>&1; then
    for v in $(ip -o link show master "$NODE_BRIDGE" 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1); do
      ip link del "$v" 2>/dev/null || true
    done
    ip link del "$NODE_BRIDGE" 2>/dev/null || true
  fi
  iptables -w -D FORWARD -j ENVPOOL-NODE 2>/dev/null || true
  iptables -w -F ENVPOOL-NODE 2>/dev/null || true
  iptables -w -X ENVPOOL-NODE 2>/dev/null || true
  for table in filter nat mangle; do
    for ch in $(iptables -w -t "$table" -S 2>/dev/null | awk '/^-N (CNI-|KUBE-)/ {print $2}'); do
      iptables -w -t "$table" -F "$ch" 2>/dev/null || true
    done
    { iptables -w -t "$table" -S 2>/dev/null | grep -E -- '-j (CNI-|KUBE-)' || true; } | sed 's/^-A/-D/' |
      while read -r r; do eval iptables -w -t "$table" "$r" 2>/dev/null || true; done
    for ch in $(iptables -w -t "$table" -S 2>/dev/null | awk '/^-N (CNI-|KUBE-)/ {print $2}'); do
      iptables -w -t "$table" -X "$ch" 2>/dev/null || true
    done
  done
  [ -f "$ND/ip_forward.orig" ] && sysctl -qw "net.ipv4.ip_forward=$(cat "$ND/ip_forward.orig")" && rm -f "$ND/ip_forward.orig"
  for c in /sys/fs/cgroup/*/kubepods; do
    [ -d "$c" ] && find "$c" -depth -type d -exec rmdir {} \; 2>/dev/null
  done
  # 4. verify
  local left
  left=$(pgrep -f "$ND|$KUBENODE_BIN|$COREDNS_BIN" 2>/dev/null || true)
  [ -n "$left" ] && { log "processes left: $left"; rc=1; }
  if awk -v a="$ND" -v b="$CTRD_ROOT" 'index($2, a) == 1 || index($2, b) == 1' /proc/mounts | grep -q .; then
    log "mounts left under $ND or $CTRD_ROOT"; rc=1
  fi
  ip link show "$NODE_BRIDGE" >/dev/null 2>&1 && { log "bridge $NODE_BRIDGE left"; rc=1; }
  if iptables-save 2>/dev/null | grep -qE '^:(ENVPOOL-NODE|KUBE-|CNI-)'; then log "iptables chains of ours left"; rc=1; fi
  # the node object goes with the cluster; the node's state (not the images) is reset
  rm -rf --one-file-system "$ND"
  return $rc
}

case "${1:-}" in
  up) cmd_up ;;
  down) cmd_down ;;
  check) pid_alive "$ND/kubelet.pid" && node_ready ;;
  images) pid_alive "$ND/containerd.pid" || die "containerd is not running (node.sh up)"; cmd_images ;;
  *) echo "usage: $0 up|down|check|images" >&2; exit 2 ;;
esac
