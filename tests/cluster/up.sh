#!/usr/bin/env bash
# Bring up the local e2e control plane (idempotent):
#   etcd + kube-apiserver + kube-controller-manager + kube-scheduler + kwok
#   (kwokctl --runtime binary, local binaries only), NODE_COUNT fake nodes,
#   the KubeRay CRDs and the real KubeRay operator running on the host.
#
#   eval "$(tests/cluster/up.sh)"      # prints: export KUBECONFIG=...
#
# Progress goes to stderr, the export line to stdout. If the cluster is up and
# healthy it is reused (a few seconds). Missing binaries are built first with
# build.sh (cold: tens of minutes) unless ENVPOOL_CLUSTER_NO_BUILD=1.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
close_inherited_fds
mkdir -p "$STATE"
# one up/down at a time (parallel pytest sessions, CI + a developer)
exec 9>"$STATE/.lock"
flock 9
# (long-lived children are started with 9>&- so they do not hold the lock)

KWOK_COMPONENTS=(etcd kube-apiserver kube-controller-manager kube-scheduler kwok-controller)

# Every component up.sh starts is alive and answering (health.sh), the nodes are
# Ready and the CRDs there. Anything less is mended below, never reused as is.
healthy() {
  bash "$HERE/health.sh" status >/dev/null 2>&1 9>&- || return 1
  local ready
  ready=$(kc get nodes -o jsonpath='{range .items[*]}{.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}' 2>/dev/null | grep -c True || true)
  [ "$ready" -ge "$NODE_COUNT" ] || return 1
  kc get crd rayclusters.ray.io >/dev/null 2>&1
}

# Delete the kwok cluster with everything that holds its credentials: the real
# node's parts and the KubeRay operator would keep the old CA otherwise.
delete_cluster() {
  if [ "$REAL_NODE" = 1 ]; then bash "$HERE/node.sh" down 9>&- >&2 || true; fi
  if operator_running; then kill "$(cat "$OPERATOR_PID")" 2>/dev/null || true; fi
  "$KWOKCTL" delete cluster --name "$CLUSTER_NAME" --kubeconfig "$KUBECONFIG_PATH" >&2 2>&1 || true
}

print_export() {
  echo "export KUBECONFIG=$KUBECONFIG_PATH"
}

# ---- 0. binaries ----------------------------------------------------------
REAL_NODE="${ENVPOOL_CLUSTER_REAL_NODE:-1}"
need=("$KUBE_BIN/kube-apiserver" "$KUBE_BIN/kube-controller-manager" "$KUBE_BIN/kube-scheduler" \
  "$KUBECTL" "$ETCD_BIN/etcd" "$KWOK_BIN/kwok" "$KWOKCTL" "$KUBERAY_DIR/bin/ray-operator" "$HELM_BIN/helm")
[ "$REAL_NODE" = 1 ] && need+=("$KUBENODE_BIN/kubelet" "$KUBENODE_BIN/kube-proxy" "$COREDNS_BIN/coredns")
missing=()
for b in "${need[@]}"; do [ -x "$b" ] || missing+=("$b"); done
if [ ${#missing[@]} -gt 0 ]; then
  [ "${ENVPOOL_CLUSTER_NO_BUILD:-0}" = 1 ] && die "missing binaries (run tests/cluster/build.sh): ${missing[*]}"
  log "missing binaries: ${missing[*]} -> running build.sh (cold build can take long)"
  "$HERE/build.sh" >&2 || die "build.sh failed"
fi
[ -d "$KUBERAY_DIR/crds" ] || die "KubeRay CRDs missing in $KUBERAY_DIR/crds (rebuild kuberay)"

# ---- 0b. the kwokctl config (a cluster made with another one is recreated) -----
cfg="$STATE/kwokctl.yaml"
applied="$STATE/kwokctl.applied.yaml"
cat >"$cfg.new" <<YAML
apiVersion: config.kwok.x-k8s.io/v1alpha1
kind: KwokctlConfiguration
options:
  runtime: binary
  kubeVersion: "$KUBE_VERSION"
  etcdVersion: "${ETCD_VERSION#v}"
  kwokVersion: "$KWOK_VERSION"
  bindAddress: 127.0.0.1
  cacheDir: "$STATE/kwok/cache"
  kubeBinaryPrefix: "$KUBE_BIN"
  kubeApiserverBinary: "$KUBE_BIN/kube-apiserver"
  kubeControllerManagerBinary: "$KUBE_BIN/kube-controller-manager"
  kubeSchedulerBinary: "$KUBE_BIN/kube-scheduler"
  kubectlBinary: "$KUBECTL"
  etcdBinaryPrefix: "$ETCD_BIN"
  etcdBinary: "$ETCD_BIN/etcd"
  kwokBinaryPrefix: "$KWOK_BIN"
  kwokControllerBinary: "$KWOK_BIN/kwok"
  components: [etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok-controller]
  # the real node's pods reach the API server at the kubernetes Service / the node IP
  kubeApiserverCertSANs: ["$NODE_IP", "${SERVICE_CIDR%.*/*}.1"]
componentsPatches:
- name: kube-apiserver
  extraArgs:
  - {key: service-cluster-ip-range, value: "$SERVICE_CIDR"}
  # the kubernetes Service's endpoint: node.sh relays NODE_IP:<port> to the loopback listener
  - {key: advertise-address, value: "$NODE_IP"}
  # logs/exec/port-forward to the real kubelet: by its InternalIP (never the
  # machine's DNS), with the cluster's client certificate
  - {key: kubelet-preferred-address-types, value: InternalIP}
  - {key: kubelet-client-certificate, value: "$KWOK_WORKDIR/clusters/$CLUSTER_NAME/pki/admin.crt"}
  - {key: kubelet-client-key, value: "$KWOK_WORKDIR/clusters/$CLUSTER_NAME/pki/admin.key"}
# Single instances: no leader election. An elected component that cannot renew its
# lease (an API server slower than the 10 s renew deadline on a loaded 2-core
# machine) exits by design, and nothing would restart it.
- name: kube-controller-manager
  extraArgs:
  - {key: leader-elect, value: "false"}
- name: kube-scheduler
  extraArgs:
  - {key: leader-elect, value: "false"}
- name: kwok-controller
  extraArgs:
  # kwok fakes only its own nodes: pods on the real node are the kubelet's
  - {key: manage-all-nodes, value: "false"}
  - {key: manage-nodes-with-annotation-selector, value: "kwok.x-k8s.io/node=fake"}
YAML
mv "$cfg.new" "$cfg"
if cluster_exists && ! cmp -s "$cfg" "$applied"; then
  log "cluster '$CLUSTER_NAME' was made with another kwokctl config: recreating it"
  delete_cluster
fi

# ---- 1. reuse -------------------------------------------------------------
if healthy; then
  log "cluster '$CLUSTER_NAME' already up and healthy: reusing"
  # the project image follows the source (a change rebuilds its top layer)
  if [ "$REAL_NODE" = 1 ]; then bash "$HERE/node.sh" images 9>&- || die "node images failed"; fi
  print_export
  exit 0
fi

# ---- 2. control plane -----------------------------------------------------
# a component alive but not answering is killed here so that it is started again
bash "$HERE/health.sh" reap 20 9>&- >&2 || true
if cluster_exists && ! bash "$HERE/health.sh" status "${KWOK_COMPONENTS[@]}" >/dev/null 2>&1 9>&-; then
  log "cluster '$CLUSTER_NAME' is not whole: $(bash "$HERE/health.sh" status "${KWOK_COMPONENTS[@]}" 9>&- 2>/dev/null | grep -v ' ok ' | cut -d' ' -f1,2 | paste -sd, -)"
  log "kwokctl start cluster (starts only the components that are not running)"
  # kwokctl takes any pid that answers kill -0 for running, a killed component that
  # init has not reaped yet (a zombie) too: forget the pids of what is not running
  for c in "${KWOK_COMPONENTS[@]}"; do
    f="$KWOK_WORKDIR/clusters/$CLUSTER_NAME/pids/$c.pid"
    if [ -f "$f" ] && ! pidfile_running "$f"; then rm -f "$f"; fi
  done
  "$KWOKCTL" start cluster --name "$CLUSTER_NAME" --timeout 60s >&2 2>&1 9>&- || true
  if ! apiserver_ready; then
    log "still not serving: deleting and recreating"
    delete_cluster
  fi
fi

if ! cluster_exists; then
  rm -f "$KUBECONFIG_PATH"
  log "kwokctl create cluster --name $CLUSTER_NAME --runtime binary ($KUBE_VERSION, etcd $ETCD_VERSION, kwok $KWOK_VERSION)"
  if ! "$KWOKCTL" --config "$cfg" create cluster --name "$CLUSTER_NAME" --runtime binary \
        --kubeconfig "$KUBECONFIG_PATH" --wait 120s --timeout 180s >&2 2>&1 9>&-; then
    log "kwokctl create cluster failed; component logs:"
    for f in "$KWOK_WORKDIR/clusters/$CLUSTER_NAME"/logs/*.log; do
      [ -f "$f" ] && { echo "--- $f" >&2; tail -n 20 "$f" >&2; }
    done
    die "kwokctl create cluster failed"
  fi
  cp "$cfg" "$applied"
fi

# kwokctl writes the context into --kubeconfig; make sure it is there
if [ ! -s "$KUBECONFIG_PATH" ]; then
  "$KWOKCTL" get kubeconfig --name "$CLUSTER_NAME" >"$KUBECONFIG_PATH"
fi
chmod 600 "$KUBECONFIG_PATH"
kc config use-context "kwok-$CLUSTER_NAME" >/dev/null 2>&1 || true

for _ in $(seq 1 60); do apiserver_ready && break; sleep 1; done
apiserver_ready || die "kube-apiserver not ready (see $KWOK_WORKDIR/clusters/$CLUSTER_NAME/logs)"
log "kube-apiserver ready: $(kc version -o json 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["serverVersion"]["gitVersion"])' 2>/dev/null || echo '?')"

# ---- 3. fake nodes --------------------------------------------------------
nodes_yaml=""
for i in $(seq 0 $((NODE_COUNT - 1))); do
  nodes_yaml+="---
apiVersion: v1
kind: Node
metadata:
  name: kwok-node-$i
  annotations:
    node.alpha.kubernetes.io/ttl: \"0\"
    kwok.x-k8s.io/node: fake
  labels:
    kubernetes.io/arch: amd64
    kubernetes.io/hostname: kwok-node-$i
    kubernetes.io/os: linux
    kubernetes.io/role: agent
    node-role.kubernetes.io/agent: \"\"
    type: kwok
spec: {}
status:
  allocatable: {cpu: \"32\", memory: 128Gi, pods: \"110\", ephemeral-storage: 1Ti}
  capacity: {cpu: \"32\", memory: 128Gi, pods: \"110\", ephemeral-storage: 1Ti}
  nodeInfo:
    architecture: amd64
    kubeletVersion: fake
    kubeProxyVersion: fake
    operatingSystem: linux
  phase: Running
"
done
printf '%s' "$nodes_yaml" | kc apply -f - >&2
kc wait --for=condition=Ready node --all --timeout=60s >&2 || die "fake nodes did not become Ready"

# ---- 4. KubeRay CRDs ------------------------------------------------------
log "installing KubeRay $KUBERAY_VERSION CRDs (server-side apply)"
kc apply --server-side --force-conflicts -f "$KUBERAY_DIR/crds/" >&2
kc wait --for=condition=Established --timeout=60s -f "$KUBERAY_DIR/crds/" >&2

# ---- 5. KubeRay operator on the host -------------------------------------
if ! operator_ready; then
  if operator_running; then
    log "ray-operator running but not ready$(same_cluster "$OPERATOR_CA" || echo " (started against another cluster's CA)"): restarting"
    kill "$(cat "$OPERATOR_PID")" 2>/dev/null || true
    for _ in $(seq 1 50); do operator_running || break; sleep 0.2; done
    operator_running && kill -9 "$(cat "$OPERATOR_PID")" 2>/dev/null || true
  fi
  mport=$(free_port); pport=$(free_port)
  while [ "$pport" = "$mport" ]; do pport=$(free_port); done
  printf 'metrics=%s\nprobe=%s\n' "$mport" "$pport" >"$OPERATOR_PORTS"
  log "starting ray-operator (metrics 127.0.0.1:$mport, probes 127.0.0.1:$pport, log $OPERATOR_LOG)"
  KUBECONFIG="$KUBECONFIG_PATH" setsid nohup "$KUBERAY_DIR/bin/ray-operator" \
    -enable-leader-election=false \
    -metrics-addr="127.0.0.1:$mport" \
    -health-probe-bind-address="127.0.0.1:$pport" \
    -log-stdout-encoder=console \
    >"$OPERATOR_LOG" 2>&1 </dev/null 9>&- &
  echo $! >"$OPERATOR_PID"
  cluster_ca_id >"$OPERATOR_CA"
  for _ in $(seq 1 120); do
    operator_ready && break
    operator_running || { tail -n 40 "$OPERATOR_LOG" >&2; die "ray-operator exited"; }
    sleep 0.5
  done
  operator_ready || { tail -n 40 "$OPERATOR_LOG" >&2; die "ray-operator not ready after 60s"; }
fi

# ---- 6. the real node ------------------------------------------------------
if [ "$REAL_NODE" = 1 ]; then
  bash "$HERE/node.sh" up 9>&- || die "real node $NODE_NAME did not come up (logs in $NODE_DIR)"
fi

# components answer their health endpoints a few seconds after they start (kube-proxy
# after its first sync): give them a minute before calling the cluster broken
for _ in $(seq 1 60); do healthy && break; sleep 1; done
healthy || die "cluster came up but is not healthy:
$(bash "$HERE/health.sh" status 9>&- 2>&1 | grep -v ' ok ')"
log "cluster '$CLUSTER_NAME' ready: $NODE_COUNT kwok nodes$([ "$REAL_NODE" = 1 ] && echo " + real node $NODE_NAME"), KubeRay $KUBERAY_VERSION (pid $(cat "$OPERATOR_PID"))"
print_export
