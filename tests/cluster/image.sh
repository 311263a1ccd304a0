#!/usr/bin/env bash
# Build the images the real test node runs, offline from any image registry, with
# buildah (daemonless, Debian's package) into a store OUTSIDE the repo:
#
#   1. pause      the pod sandbox (tests/cluster/go/pause, a static Go binary).
#   2. ray base   a stand-in for `rayproject/ray:<RAY_VERSION>-py311`, the one FROM
#                 line of the Dockerfile: Debian bookworm (debootstrap) + python3.11
#                 + ray[default]==RAY_VERSION from PyPI in /home/ray/venv, user ray
#                 (1000:100) and wget (KubeRay's probes run it) as in the Ray images.
#                 Keyed by this recipe's inputs.
#   3. envpool    the project's own Dockerfile built on that base
#                 (--build-arg RAY_IMAGE=<base>), with --layers, so a source change
#                 rebuilds only the top layer. Keyed by the Dockerfile, pyproject.toml
#                 and the source trees.
#   4. trainer    a learner's image WITHOUT Ray: Debian python3, gymnasium, numpy and
#                 this package installed --no-deps (the lease API + TCP trainer path);
#                 the build fails if `import ray` works in it.
#   4. redis      the Redis the operator runs for each pool with GCS fault tolerance
#                 (spec.headFaultTolerance): Debian $DEBIAN_SUITE (debootstrap minbase)
#                 with Debian's redis-server package, nothing else; redis-server on the
#                 PATH, runs as any uid. Keyed by this recipe and the package version
#                 Debian's archive offers (apt-cache policy on this Debian host).
#
# Each image is exported as a docker-archive tar under $CACHE/images/ whose name
# carries its key; a tar that exists is never rebuilt. node.sh imports them into
# the node's containerd. Prints progress to stderr and, on stdout, the lines
#   PAUSE_IMAGE=...  BASE_IMAGE=...  ENVPOOL_IMAGE=...  ENVPOOL_IMAGE_TAR=...
#   TRAINER_IMAGE=...  TRAINER_IMAGE_TAR=...  REDIS_IMAGE=...  REDIS_IMAGE_TAR=...
#
#   tests/cluster/image.sh            # all five (cached parts skipped)
#   tests/cluster/image.sh redis      # the Redis image only (REDIS_IMAGE* lines)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
REPO="$(cd "$HERE/../.." && pwd)"
IMG="$CACHE/images"
mkdir -p "$IMG" "$STATE"
exec 8>"$IMG/.lock"
flock 8

for tool in buildah debootstrap; do
  command -v "$tool" >/dev/null || {
    log "installing $tool (Debian package)"
    apt_install buildah debootstrap
  }
done

# buildah keeps its layers in the cache (reused across runs), its run state in STATE
BUILDAH=(buildah --root "$IMG/storage" --runroot "$STATE/buildah-run" --storage-driver overlay)

key_of() { sha256sum | cut -c1-12; }

ONLY="${1:-all}"
case "$ONLY" in all|redis) ;; *) die "usage: image.sh [redis]" ;; esac
if [ "$ONLY" = all ]; then
# ---- 1. pause ---------------------------------------------------------------
pause_key=$(cat "$HERE/go/pause/main.go" "$HERE/go/pause/go.mod" | key_of)
PAUSE_IMAGE="localhost/envpool-pause:$pause_key"
pause_tar="$IMG/pause-$pause_key.tar"
if [ ! -s "$pause_tar" ]; then
  log "pause image: building $PAUSE_IMAGE"
  t=$(mktemp -d)
  (cd "$HERE/go/pause" && CGO_ENABLED=0 GOTOOLCHAIN=local go build -trimpath -ldflags "-s -w" -o "$t/pause" .)
  c=$("${BUILDAH[@]}" from scratch)
  "${BUILDAH[@]}" copy "$c" "$t/pause" /pause >/dev/null
  "${BUILDAH[@]}" config --entrypoint '["/pause"]' --user 65535:65535 "$c"
  "${BUILDAH[@]}" commit -q "$c" "$PAUSE_IMAGE" >/dev/null
  "${BUILDAH[@]}" rm "$c" >/dev/null
  "${BUILDAH[@]}" push -q "$PAUSE_IMAGE" "docker-archive:$pause_tar.tmp:$PAUSE_IMAGE"
  mv "$pause_tar.tmp" "$pause_tar"; rm -rf "$t"
fi

# ---- 2. ray base ------------------------------------------------------------
# The host's CA bundle is bind-mounted for pip at build time only (this machine
# reaches PyPI through its own CA); the images keep Debian's bundle.
HOST_CA=/etc/ssl/certs/ca-certificates.crt
base_key=$( { sed -n '/^# ---- 2. ray base/,/^# ---- 3/p' "$0"; echo "$DEBIAN_SUITE $RAY_VERSION"; } | key_of)
BASE_IMAGE="localhost/envpool-ray-base:$RAY_VERSION-py311-$base_key"
base_done="$IMG/base-$base_key.done"
if [ ! -f "$base_done" ]; then
  b0=$(date +%s)
  log "ray base: building $BASE_IMAGE (debootstrap $DEBIAN_SUITE + ray[default]==$RAY_VERSION; a few minutes)"
  c=$("${BUILDAH[@]}" from scratch)
  trap '"${BUILDAH[@]}" rm "$c" >/dev/null 2>&1 || true' EXIT
  m=$("${BUILDAH[@]}" mount "$c")
  debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates,procps,wget \
    "$DEBIAN_SUITE" "$m" "$DEBIAN_MIRROR" >"$IMG/debootstrap.log" 2>&1 \
    || { tail -n 30 "$IMG/debootstrap.log" >&2; die "debootstrap failed"; }
  cp /etc/resolv.conf "$m/etc/resolv.conf"
  mkdir -p "$m/tmp/hostca" && cp "$HOST_CA" "$m/tmp/hostca/ca.crt"
  # a clean environment: this machine's REQUESTS_CA_BUNDLE/PIP_* would point pip elsewhere
  env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 chroot "$m" /bin/sh -euc "
    useradd --uid 1000 --gid 100 --create-home --home-dir /home/ray --shell /bin/bash ray
    python3 -m venv /home/ray/venv
    PIP_CERT=/tmp/hostca/ca.crt /home/ray/venv/bin/pip install -q --no-cache-dir --disable-pip-version-check 'ray[default]==$RAY_VERSION'
    chown -R 1000:100 /home/ray
    apt-get clean; rm -rf /var/lib/apt/lists/* /var/cache/apt/* /tmp/hostca
    : > /etc/resolv.conf
  " >&2
  "${BUILDAH[@]}" umount "$c" >/dev/null
  "${BUILDAH[@]}" config --user 1000:100 --workingdir /home/ray \
    --env PATH=/home/ray/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --env HOME=/home/ray --env LANG=C.UTF-8 --env PIP_CERT=/etc/ssl/certs/ca-certificates.crt --cmd '["/bin/bash"]' \
    --label "dev.envpool.stand-in-for=rayproject/ray:$RAY_VERSION-py311" "$c"
  "${BUILDAH[@]}" commit -q "$c" "$BASE_IMAGE" >/dev/null
  "${BUILDAH[@]}" rm "$c" >/dev/null; trap - EXIT
  touch "$base_done"
  log "ray base: built in $(( $(date +%s) - b0 ))s"
fi

# ---- 3. envpool (the project's Dockerfile) -------------------------------------
src_key=$( (cd "$REPO" && git ls-files -z Dockerfile pyproject.toml README.md remote_env operator \
  | xargs -0 sha256sum; echo "$BASE_IMAGE") | key_of)
ENVPOOL_IMAGE="localhost/envpool:dev-$src_key"
ENVPOOL_IMAGE_TAR="$IMG/envpool-$src_key.tar"
if [ ! -s "$ENVPOOL_IMAGE_TAR" ]; then
  e0=$(date +%s)
  log "envpool image: buildah bud Dockerfile (RAY_IMAGE=$BASE_IMAGE) -> $ENVPOOL_IMAGE"
  # build from the committed tree (what CI sees), not from stray files
  ctx=$(mktemp -d)
  (cd "$REPO" && git ls-files -z Dockerfile pyproject.toml README.md remote_env operator \
    | xargs -0 -I{} cp --parents {} "$ctx/")
  "${BUILDAH[@]}" bud -q --layers --isolation chroot --network host \
    --build-arg "RAY_IMAGE=$BASE_IMAGE" \
    -v "$HOST_CA:/etc/ssl/certs/ca-certificates.crt:ro" \
    -t "$ENVPOOL_IMAGE" -f "$ctx/Dockerfile" "$ctx" >&2
  rm -rf "$ctx"
  "${BUILDAH[@]}" push -q "$ENVPOOL_IMAGE" "docker-archive:$ENVPOOL_IMAGE_TAR.tmp:$ENVPOOL_IMAGE"
  mv "$ENVPOOL_IMAGE_TAR.tmp" "$ENVPOOL_IMAGE_TAR"
  # older project images: keep the newest few tars only
  ls -1t "$IMG"/envpool-*.tar 2>/dev/null | tail -n +4 | xargs -r rm -f
  log "envpool image: built in $(( $(date +%s) - e0 ))s ($(du -m "$ENVPOOL_IMAGE_TAR" | cut -f1) MiB)"
fi

# ---- 4. trainer (no Ray) ------------------------------------------------------
# A learner's image as users bring them: Debian's python3 and a venv with what a
# trainer stepping over the lease API and TCP needs, this package installed with
# --no-deps, and NO Ray. Two images: the base (debootstrap + PyPI deps, keyed by this
# recipe) and the top (the package from the committed tree, keyed by its source).
# Checked at build time: `import ray` must fail in it, `import remote_env` must not.
# the 'client' extra of pyproject.toml (tests/unit/test_data_ports.py checks they agree)
TRAINER_PIP_DEPS="'gymnasium>=1.2,<2' 'numpy>=1.26' 'prometheus-client>=0.20' 'cloudpickle>=2' 'pyyaml>=6'"
trainer_base_key=$( { sed -n '/^# ---- 4. trainer/,/^trainer_key=/p' "$0" | grep -v '^trainer_key='; echo "$DEBIAN_SUITE"; } | key_of)
TRAINER_BASE="localhost/envpool-trainer-base:$trainer_base_key"
trainer_base_done="$IMG/trainer-base-$trainer_base_key.done"
if [ ! -f "$trainer_base_done" ]; then
  b0=$(date +%s)
  log "trainer base: building $TRAINER_BASE (debootstrap $DEBIAN_SUITE + $TRAINER_PIP_DEPS; no Ray)"
  c=$("${BUILDAH[@]}" from scratch)
  trap '"${BUILDAH[@]}" rm "$c" >/dev/null 2>&1 || true' EXIT
  m=$("${BUILDAH[@]}" mount "$c")
  debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
    "$DEBIAN_SUITE" "$m" "$DEBIAN_MIRROR" >"$IMG/debootstrap-trainer.log" 2>&1 \
    || { tail -n 30 "$IMG/debootstrap-trainer.log" >&2; die "debootstrap (trainer) failed"; }
  cp /etc/resolv.conf "$m/etc/resolv.conf"
  mkdir -p "$m/tmp/hostca" && cp "$HOST_CA" "$m/tmp/hostca/ca.crt"
  env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 chroot "$m" /bin/sh -euc "
    useradd --uid 1000 --gid 100 --create-home --home-dir /home/trainer --shell /bin/sh trainer
    python3 -m venv /opt/venv
    PIP_CERT=/tmp/hostca/ca.crt /opt/venv/bin/pip install -q --no-cache-dir --disable-pip-version-check $TRAINER_PIP_DEPS
    apt-get clean; rm -rf /var/lib/apt/lists/* /var/cache/apt/* /tmp/hostca
    : > /etc/resolv.conf
  " >&2
  "${BUILDAH[@]}" umount "$c" >/dev/null
  "${BUILDAH[@]}" config --user 1000:100 --workingdir /home/trainer \
    --env PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --env HOME=/home/trainer --env LANG=C.UTF-8 --env PYTHONUNBUFFERED=1 --cmd '["/bin/sh"]' "$c"
  "${BUILDAH[@]}" commit -q "$c" "$TRAINER_BASE" >/dev/null
  "${BUILDAH[@]}" rm "$c" >/dev/null; trap - EXIT
  touch "$trainer_base_done"
  log "trainer base: built in $(( $(date +%s) - b0 ))s"
fi
trainer_key=$( (cd "$REPO" && git ls-files -z pyproject.toml README.md remote_env operator \
  | xargs -0 sha256sum; echo "$TRAINER_BASE") | key_of)
TRAINER_IMAGE="localhost/envpool-trainer:dev-$trainer_key"
TRAINER_IMAGE_TAR="$IMG/trainer-$trainer_key.tar"  # not envpool-*: section 3 prunes those
if [ ! -s "$TRAINER_IMAGE_TAR" ]; then
  t0=$(date +%s)
  log "trainer image: this package --no-deps on $TRAINER_BASE -> $TRAINER_IMAGE"
  ctx=$(mktemp -d)
  (cd "$REPO" && git ls-files -z pyproject.toml README.md remote_env operator \
    | xargs -0 -I{} cp --parents {} "$ctx/")
  c=$("${BUILDAH[@]}" from "$TRAINER_BASE")
  trap '"${BUILDAH[@]}" rm "$c" >/dev/null 2>&1 || true; rm -rf "$ctx"' EXIT
  # root for the install (the venv is root's), then back to the trainer's user
  "${BUILDAH[@]}" copy "$c" "$ctx" /tmp/src >/dev/null
  "${BUILDAH[@]}" run --isolation chroot --network host --user 0:0 \
    -v "$HOST_CA:/etc/ssl/certs/ca-certificates.crt:ro" "$c" -- sh -euc '
      PIP_CERT=/etc/ssl/certs/ca-certificates.crt pip install -q --no-cache-dir --disable-pip-version-check --no-deps /tmp/src
      rm -rf /tmp/src' >&2
  "${BUILDAH[@]}" run --isolation chroot "$c" -- python -c 'import remote_env, gymnasium, numpy' >&2 \
    || die "trainer image: remote_env does not import"
  if "${BUILDAH[@]}" run --isolation chroot "$c" -- python -c 'import ray' >/dev/null 2>&1; then
    die "trainer image: import ray succeeded; it must have no Ray"
  fi
  "${BUILDAH[@]}" commit -q "$c" "$TRAINER_IMAGE" >/dev/null
  "${BUILDAH[@]}" rm "$c" >/dev/null; trap - EXIT; rm -rf "$ctx"
  "${BUILDAH[@]}" push -q "$TRAINER_IMAGE" "docker-archive:$TRAINER_IMAGE_TAR.tmp:$TRAINER_IMAGE"
  mv "$TRAINER_IMAGE_TAR.tmp" "$TRAINER_IMAGE_TAR"
  ls -1t "$IMG"/trainer-*.tar 2>/dev/null | tail -n +4 | xargs -r rm -f
  log "trainer image: built in $(( $(date +%s) - t0 ))s ($(du -m "$TRAINER_IMAGE_TAR" | cut -f1) MiB)"
fi
fi  # ONLY=all

# ---- 4. redis ----------------------------------------------------------------
# Keyed by the package version Debian offers for the suite (the host is Debian too;
# an unknown version keys by the suite alone), so a point release rebuilds it once.
redis_version=$(apt-cache policy redis-server 2>/dev/null | sed -n 's/^ *Candidate: *//p' | head -n1)
redis_key=$( { sed -n '/^# ---- 4. redis/,/^# ---- end/p' "$0"; echo "$DEBIAN_SUITE ${redis_version:-unknown}"; } | key_of)
REDIS_IMAGE="localhost/envpool-redis:${redis_version//[^A-Za-z0-9_.-]/_}-$redis_key"
REDIS_IMAGE_TAR="$IMG/redis-$redis_key.tar"
if [ ! -s "$REDIS_IMAGE_TAR" ]; then
  r0=$(date +%s)
  log "redis image: building $REDIS_IMAGE (debootstrap $DEBIAN_SUITE + redis-server ${redis_version:-?})"
  c=$("${BUILDAH[@]}" from scratch)
  trap '"${BUILDAH[@]}" rm "$c" >/dev/null 2>&1 || true' EXIT
  m=$("${BUILDAH[@]}" mount "$c")
  debootstrap --variant=minbase --include=redis-server \
    "$DEBIAN_SUITE" "$m" "$DEBIAN_MIRROR" >"$IMG/debootstrap-redis.log" 2>&1 \
    || { tail -n 30 "$IMG/debootstrap-redis.log" >&2; die "debootstrap (redis) failed"; }
  chroot "$m" /bin/sh -euc '
    apt-get clean; rm -rf /var/lib/apt/lists/* /var/cache/apt/* /usr/share/doc/* /usr/share/man/*
    mkdir -p /data && chmod 1777 /data
  ' >&2
  "${BUILDAH[@]}" umount "$c" >/dev/null
  "${BUILDAH[@]}" config --user 999:999 --workingdir /data --entrypoint '["redis-server"]' --cmd '[]' \
    --label "dev.envpool.redis-server=${redis_version:-unknown}" "$c"
  "${BUILDAH[@]}" commit -q "$c" "$REDIS_IMAGE" >/dev/null
  "${BUILDAH[@]}" rm "$c" >/dev/null; trap - EXIT
  "${BUILDAH[@]}" push -q "$REDIS_IMAGE" "docker-archive:$REDIS_IMAGE_TAR.tmp:$REDIS_IMAGE"
  mv "$REDIS_IMAGE_TAR.tmp" "$REDIS_IMAGE_TAR"
  log "redis image: built in $(( $(date +%s) - r0 ))s ($(du -m "$REDIS_IMAGE_TAR" | cut -f1) MiB)"
fi
# ---- end

if [ "$ONLY" = all ]; then
  echo "PAUSE_IMAGE=$PAUSE_IMAGE"
  echo "PAUSE_IMAGE_TAR=$pause_tar"
  echo "BASE_IMAGE=$BASE_IMAGE"
  echo "ENVPOOL_IMAGE=$ENVPOOL_IMAGE"
  echo "ENVPOOL_IMAGE_TAR=$ENVPOOL_IMAGE_TAR"
  echo "TRAINER_IMAGE=$TRAINER_IMAGE"
  echo "TRAINER_IMAGE_TAR=$TRAINER_IMAGE_TAR"
fi
echo "REDIS_IMAGE=$REDIS_IMAGE"
echo "REDIS_IMAGE_TAR=$REDIS_IMAGE_TAR"
