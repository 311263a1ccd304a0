#!/usr/bin/env bash
# Build the local Kubernetes control plane used by the e2e tests from the Go
# module proxy, into a cache OUTSIDE the repo, keyed by version:
#
#   ${ENVPOOL_CLUSTER_CACHE:-$HOME/.cache/envpool-cluster}/<component>-<version>/bin/
#
# Components: kubernetes (kube-apiserver, kube-controller-manager,
# kube-scheduler, kubectl), kubenode (kubelet, kube-proxy: the real node, from
# the same k8s.io/kubernetes module and build cache), coredns, etcd, kwok (kwok,
# kwokctl), kuberay (ray-operator + CRDs in crds/), helm. A component whose stamp file and binaries are present
# is skipped. A component that fails is reported and the others still build;
# the exit status is non-zero if any failed.
#
#   tests/cluster/build.sh [component...]     # default: all
#   ENVPOOL_CLUSTER_JOBS=2 (go build -p), ENVPOOL_CLUSTER_FORCE=1 (rebuild)
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$HERE/versions.env"

CACHE="${ENVPOOL_CLUSTER_CACHE:-$HOME/.cache/envpool-cluster}"
JOBS="${ENVPOOL_CLUSTER_JOBS:-2}"
export CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS="-buildvcs=false -mod=readonly"
# keep the go build cache outside the repo too (default already is)
export GOCACHE="${GOCACHE:-$(go env GOCACHE)}"

command -v go >/dev/null || { echo "build.sh: go not found in PATH" >&2; exit 1; }
mkdir -p "$CACHE"

components=("$@")
[ ${#components[@]} -gt 0 ] || components=(etcd kwok helm kuberay kubernetes kubenode coredns)

T0=$(date +%s)
log() { printf '[build %4ss] %s\n' "$(( $(date +%s) - T0 ))" "$*"; }

# comp -> version, binaries
comp_version() {
  case $1 in
    kubernetes|kubenode) echo "$KUBE_VERSION" ;; coredns) echo "$COREDNS_VERSION" ;; etcd) echo "$ETCD_VERSION" ;;
    kwok) echo "$KWOK_VERSION" ;; kuberay) echo "$KUBERAY_VERSION" ;;
    helm) echo "$HELM_VERSION" ;; *) return 1 ;;
  esac
}
comp_bins() {
  case $1 in
    kubernetes) echo "kube-apiserver kube-controller-manager kube-scheduler kubectl" ;;
    kubenode) echo "kubelet kube-proxy" ;; coredns) echo "coredns" ;;
    etcd) echo "etcd" ;; kwok) echo "kwok kwokctl" ;;
    kuberay) echo "ray-operator" ;; helm) echo "helm" ;;
  esac
}
comp_dir() { echo "$CACHE/$1-$(comp_version "$1")"; }

is_built() {
  local d b
  d=$(comp_dir "$1")
  [ -f "$d/stamp" ] || return 1
  for b in $(comp_bins "$1"); do [ -x "$d/bin/$b" ] || return 1; done
}

# go build with optional /usr/bin/time -v; prints elapsed + peak RSS
gobuild() { # outdir ldflags pkg...
  local out=$1 ldflags=$2; shift 2
  local tv=()
  [ -x /usr/bin/time ] && tv=(/usr/bin/time -v -o "$out/.time")
  "${tv[@]}" go build -p "$JOBS" -trimpath -ldflags "-s -w $ldflags" -o "$out/" "$@"
  if [ -f "$out/.time" ]; then
    grep -E 'Elapsed|Maximum resident' "$out/.time" | sed 's/^\s*/    /'
    cat "$out/.time" >>"$out/../time.log"; rm -f "$out/.time"
  fi
}

kube_ldflags() {
  local v=$KUBE_VERSION maj min ld="" p
  maj=$(echo "${v#v}" | cut -d. -f1); min=$(echo "${v#v}" | cut -d. -f2)
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld+=" -X $p.gitVersion=$v -X $p.gitMajor=$maj -X $p.gitMinor=$min -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
  done
  echo "$ld"
}
build_kubernetes() { # tmpdir
  local t=$1 ld p
  ld=$(kube_ldflags)
  cd "$HERE/go/kubernetes"
  # one binary at a time: kube-apiserver's link alone needs several GiB
  for p in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
    log "kubernetes: go build $p"
    gobuild "$t/bin" "$ld" "k8s.io/kubernetes/cmd/$p"
  done
  "$t/bin/kubectl" version --client
}
build_kubenode() { # tmpdir: same module as kubernetes, so mostly its build cache
  local t=$1 ld p
  ld=$(kube_ldflags)
  cd "$HERE/go/kubernetes"
  for p in kubelet kube-proxy; do
    log "kubenode: go build $p"
    gobuild "$t/bin" "$ld" "k8s.io/kubernetes/cmd/$p"
  done
  "$t/bin/kubelet" --version
}
build_coredns() {
  local t=$1
  cd "$HERE/go/coredns"
  gobuild "$t/bin" "-X github.com/coredns/coredns/coremain.GitCommit=$COREDNS_VERSION" github.com/coredns/coredns
  [ -x "$t/bin/coredns" ] || { echo "coredns binary missing" >&2; return 1; }
  "$t/bin/coredns" -version
}
build_etcd() {
  local t=$1
  cd "$HERE/go/etcd"
  gobuild "$t/bin" "" go.etcd.io/etcd/server/v3
  mv "$t/bin/v3" "$t/bin/etcd" 2>/dev/null || mv "$t/bin/server" "$t/bin/etcd" 2>/dev/null || true
  "$t/bin/etcd" --version
}
build_kwok() {
  local t=$1
  cd "$HERE/go/kwok"
  # consts.Version is already "0.8.0" in the module; kube version comes from KWOK_KUBE_VERSION
  gobuild "$t/bin" "" \
    sigs.k8s.io/kwok/cmd/kwok sigs.k8s.io/kwok/cmd/kwokctl
  "$t/bin/kwokctl" --version
}
build_kuberay() {
  local t=$1 src
  cd "$HERE/go/kuberay"
  gobuild "$t/bin" "" github.com/ray-project/kuberay/ray-operator
  [ -x "$t/bin/ray-operator" ] || { echo "ray-operator binary missing" >&2; return 1; }
  src=$(go list -m -f '{{.Dir}}' github.com/ray-project/kuberay/ray-operator)
  mkdir -p "$t/crds"
  cp "$src"/config/crd/bases/*.yaml "$t/crds/"
  chmod u+w "$t"/crds/*.yaml
  ls "$t/crds"
}
build_helm() {
  local t=$1
  cd "$HERE/go/helm"
  gobuild "$t/bin" "-X helm.sh/helm/v3/internal/version.version=$HELM_VERSION -X helm.sh/helm/v3/internal/version.gitTreeState=clean" \
    helm.sh/helm/v3/cmd/helm
  "$t/bin/helm" version
}

failed=()
for c in "${components[@]}"; do
  ver=$(comp_version "$c") || { echo "unknown component: $c" >&2; failed+=("$c"); continue; }
  dir=$(comp_dir "$c")
  if [ "${ENVPOOL_CLUSTER_FORCE:-0}" != 1 ] && is_built "$c"; then
    log "$c $ver: cached in $dir (skip)"
    continue
  fi
  log "$c $ver: building -> $dir"
  tmp="$dir.tmp.$$"
  rm -rf "$tmp"; mkdir -p "$tmp/bin"
  c0=$(date +%s)
  set +e
  ( set -euo pipefail; "build_$c" "$tmp" ) 2>&1 | sed -u "s/^/  [$c] /"
  rc=${PIPESTATUS[0]}
  set -e
  if [ "$rc" = 0 ]; then
    secs=$(( $(date +%s) - c0 ))
    peak=$(awk '/Maximum resident/ {if ($NF>m) m=$NF} END {print m+0}' "$tmp/time.log" 2>/dev/null || echo 0)
    rm -f "$tmp/time.log"
    {
      echo "component=$c"; echo "version=$ver"; echo "go=$(go env GOVERSION)"
      echo "built_at=$(date -u +%FT%TZ)"; echo "build_seconds=$secs"
      echo "peak_rss_kib=$peak"
      echo "bins=$(comp_bins "$c")"
    } >"$tmp/stamp"
    rm -rf "$dir"; mv "$tmp" "$dir"
    log "$c $ver: OK in ${secs}s (peak RSS of one go process: $((peak / 1024)) MiB)"
  else
    log "$c $ver: FAILED after $(( $(date +%s) - c0 ))s (see error above)"
    rm -rf "$tmp"
    failed+=("$c")
  fi
done

if [ ${#failed[@]} -gt 0 ]; then
  log "FAILED components: ${failed[*]}"
  exit 1
fi
log "all components ready in $CACHE"
