#!/usr/bin/env bash
# Build the Dockerfile and run a command in the image, with podman, on a machine with no Docker
# engine and no reachable container registry (see shared NOTES §6):
#   1. apt: podman, runc, debootstrap (only if missing);
#   2. base image: if there is no localhost/debian:bookworm-slim, debootstrap a minbase bookworm
#      from the Debian mirror apt already uses, strip docs/locales, `podman import` it and tag it
#      docker.io/library/debian:bookworm-slim so that `FROM debian:bookworm-slim` resolves to it;
#   3. build context: a snapshot of the working tree in /var/tmp, plus the *.whl of /opt/wheels
#      (torch's CPU build here) in its .docker-wheels/; the Dockerfile lends them to setup.sh
#      during the set-up step only (the working tree itself is never written to);
#   4. podman --runtime runc build --format docker --pull=never --network=host -t hvd_gradq:latest CTX
#      If this host trusts extra CAs (/usr/local/share/ca-certificates/*.crt, e.g. a TLS-inspecting
#      egress proxy), its CA bundle and a pip.conf naming it are lent to the RUN steps with
#      --volume (not committed to any layer), so that pip inside the build reaches PyPI;
#   5. podman --runtime runc run --rm --network=host (+ ulimits, + NET_ADMIN and SYS_ADMIN for the
#      emulated network's namespaces and tc) hvd_gradq:latest CMD...
#
# Usage: sudo scripts/docker_check.sh [--build-only | --run-only] [CMD ARGS...]
#   CMD defaults to `bash scripts/test.sh`.
# Environment: IMAGE (default hvd_gradq:latest), WHEELS_DIR (default /opt/wheels),
#   DEBIAN_MIRROR (default: read from apt's sources), REBUILD_BASE=1 (remake the base image).
set -euo pipefail

# The whole script is one function, which bash parses completely before running it: editing this
# file while a (long) build runs cannot derail the running copy.
main() {
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

IMAGE="${IMAGE:-hvd_gradq:latest}"
WHEELS_DIR="${WHEELS_DIR:-/opt/wheels}"
BASE_LOCAL=localhost/debian:bookworm-slim
BASE_DOCKER=docker.io/library/debian:bookworm-slim
PODMAN=(podman --runtime runc)

do_build=1 do_run=1
case "${1:-}" in
  --build-only) do_run=0; shift ;;
  --run-only) do_build=0; shift ;;
  -h|--help) sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
esac
[ "${1:-}" = "--" ] && shift
if (($#)); then CMD=("$@"); else CMD=(bash scripts/test.sh); fi

die() { echo "docker_check.sh: $*" >&2; exit 1; }
T0=$(date +%s)
TIMINGS=()
phase_start() { PHASE=$1; PT0=$(date +%s); printf '\n==== [%5ss] %s\n' "$((PT0 - T0))" "$PHASE"; }
phase_end() {
  local dt=$(( $(date +%s) - PT0 ))
  TIMINGS+=("$(printf '%-44s %6ss' "$PHASE" "$dt")")
  printf '==== %s: %ss\n' "$PHASE" "$dt"
}
# shellcheck disable=SC2317  # called from the EXIT trap
print_timings() {
  local rc=$1
  printf '\n==== timings (total %ss, exit %s)\n' "$(( $(date +%s) - T0 ))" "$rc"
  local t; for t in "${TIMINGS[@]}"; do echo "  $t"; done
}

TMP_ROOTFS="" TMP_PIPCONF="" TMP_CTX=""
# shellcheck disable=SC2317  # the EXIT trap
cleanup() {
  local rc=$?
  if [ -n "$TMP_ROOTFS" ]; then rm -rf --one-file-system "$TMP_ROOTFS" "$TMP_ROOTFS.log"; fi
  if [ -n "$TMP_PIPCONF" ]; then rm -rf "$TMP_PIPCONF"; fi
  if [ -n "$TMP_CTX" ]; then rm -rf "$TMP_CTX"; fi
  print_timings "$rc"
}
trap cleanup EXIT

[ "$(id -u)" -eq 0 ] || die "must run as root (it installs packages with apt, and rootful podman with runc is what works here): sudo $0 $*"
[ -f Dockerfile ] || die "no Dockerfile in $ROOT"

# ---- 1. tools -------------------------------------------------------------------------------
phase_start "apt: podman runc debootstrap"
missing=()
for p in podman runc debootstrap; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "installing ${missing[*]}"
  apt-get update -qq || die "apt-get update failed"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" \
    || die "apt-get install ${missing[*]} failed"
else
  echo "all present: $(podman --version), runc $(runc --version | sed -n 's/^runc version //p')"
fi
phase_end

# ---- 2. base image --------------------------------------------------------------------------
# The first bookworm (not -security) mirror in apt's sources, one-line or deb822 format.
debian_mirror() {
  local f
  if [ -f /etc/apt/sources.list ]; then
    awk '$1 == "deb" { i = 2; if ($2 ~ /^\[/) while ($i !~ /\]$/) i++; if ($2 ~ /^\[/) i++;
                       if ($(i+1) ~ /^bookworm(-updates)?$/) { print $i; exit } }' /etc/apt/sources.list
  fi
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    awk 'BEGIN { RS = ""; FS = "\n" }
         { uris = ""; suites = ""; enabled = 1
           for (k = 1; k <= NF; k++) {
             if ($k ~ /^URIs:/) { uris = $k; sub(/^URIs:[ \t]*/, "", uris) }
             if ($k ~ /^Suites:/) { suites = $k; sub(/^Suites:[ \t]*/, "", suites) }
             if ($k ~ /^Enabled:[ \t]*no/) enabled = 0 }
           if (enabled && (" " suites " ") ~ / bookworm /) { split(uris, u, " "); print u[1]; exit } }' "$f"
  done
}

phase_start "base image $BASE_LOCAL"
if [ -n "${REBUILD_BASE:-}" ] || ! podman image exists "$BASE_LOCAL"; then
  MIRROR="${DEBIAN_MIRROR:-$(debian_mirror | head -n1)}"
  MIRROR="${MIRROR:-http://deb.debian.org/debian}"
  TMP_ROOTFS=$(mktemp -d /var/tmp/hvd_gradq-rootfs.XXXXXX)
  echo "debootstrap --variant=minbase bookworm $TMP_ROOTFS $MIRROR"
  debootstrap --variant=minbase bookworm "$TMP_ROOTFS" "$MIRROR" >"$TMP_ROOTFS.log" 2>&1 || {
    tail -n 30 "$TMP_ROOTFS.log" >&2; rm -f "$TMP_ROOTFS.log"; die "debootstrap failed (mirror $MIRROR)"; }
  rm -f "$TMP_ROOTFS.log"
  # Like the official -slim image: no docs, man pages or locales, now or in later installs.
  cat >"$TMP_ROOTFS/etc/dpkg/dpkg.cfg.d/docker-slim" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
path-exclude /usr/share/lintian/*
EOF
  find "$TMP_ROOTFS/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
  find "$TMP_ROOTFS/usr/share/doc" -mindepth 1 -type d -empty -delete
  rm -rf "$TMP_ROOTFS"/usr/share/{man,info,lintian}/* "$TMP_ROOTFS"/var/cache/apt/*.bin \
         "$TMP_ROOTFS"/var/cache/apt/archives/*.deb "$TMP_ROOTFS"/var/lib/apt/lists/* \
         "$TMP_ROOTFS"/var/log/*.log "$TMP_ROOTFS"/var/log/apt/*
  find "$TMP_ROOTFS/usr/share/locale" -mindepth 1 -maxdepth 1 -not -name locale.alias -exec rm -rf {} +
  # apt in the image: the same mirror for bookworm and bookworm-updates, plus security.
  rm -f "$TMP_ROOTFS/etc/apt/sources.list"
  cat >"$TMP_ROOTFS/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: $MIRROR
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
  echo "rootfs: $(du -sh --one-file-system "$TMP_ROOTFS" | cut -f1)"
  podman image rm -f "$BASE_LOCAL" "$BASE_DOCKER" >/dev/null 2>&1 || true
  tar -C "$TMP_ROOTFS" --numeric-owner -c . \
    | podman import \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'CMD ["bash"]' - "$BASE_LOCAL" >/dev/null
  rm -rf --one-file-system "$TMP_ROOTFS"; TMP_ROOTFS=""
else
  echo "exists"
fi
podman tag "$BASE_LOCAL" "$BASE_DOCKER"
podman image ls --format '{{.Repository}}:{{.Tag}} {{.ID}} {{.Size}}' | grep -F 'debian:bookworm-slim' || true
phase_end

# ---- 3 + 4. build context, offline wheels, build ----------------------------------------------
# The context is a snapshot of the working tree in /var/tmp (minus .git, .venv and caches;
# .dockerignore still applies on top): the build does not see edits made while it runs, and the
# offline wheels never enter the working tree, where they could be committed by mistake.
if ((do_build)); then
  phase_start "build context + wheels"
  TMP_CTX=$(mktemp -d /var/tmp/hvd_gradq-ctx.XXXXXX)
  tar -C "$ROOT" --exclude=./.git --exclude=./.venv --exclude=./.docker-wheels \
      --exclude=./.setup-logs --exclude='__pycache__' --exclude=./.mypy_cache \
      --exclude=./.ruff_cache --exclude=./.pytest_cache --exclude=./results/raw -cf - . \
    | tar -C "$TMP_CTX" -xf -
  echo "context: $TMP_CTX ($(du -sh "$TMP_CTX" | cut -f1))"
  if compgen -G "$WHEELS_DIR/*.whl" >/dev/null; then
    mkdir -p "$TMP_CTX/.docker-wheels"
    cp -l "$WHEELS_DIR"/*.whl "$TMP_CTX/.docker-wheels/" 2>/dev/null \
      || cp "$WHEELS_DIR"/*.whl "$TMP_CTX/.docker-wheels/"
    ls -l "$TMP_CTX/.docker-wheels"
  else
    echo "no wheels in $WHEELS_DIR: setup.sh will use the PyTorch CPU index inside the build"
  fi
  phase_end

  phase_start "podman build $IMAGE"
  BUILD_VOLUMES=()
  HOST_CA_BUNDLE="${HOST_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}"
  if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null && [ -f "$HOST_CA_BUNDLE" ]; then
    # One read-only folder at pip's site config dir: pip.conf + the bundle it names. RUN steps
    # see it; no layer keeps it (buildah leaves only the empty mount-point folder).
    TMP_PIPCONF=$(mktemp -d /var/tmp/hvd_gradq-pipconf.XXXXXX)
    cp "$HOST_CA_BUNDLE" "$TMP_PIPCONF/host-ca-bundle.crt"
    printf '[global]\ncert = /etc/xdg/pip/host-ca-bundle.crt\n' >"$TMP_PIPCONF/pip.conf"
    chmod 0755 "$TMP_PIPCONF"
    BUILD_VOLUMES+=(--volume "$TMP_PIPCONF:/etc/xdg/pip:ro")
    echo "lending this host's CA bundle to pip in the build (local CAs: $(cd /usr/local/share/ca-certificates && echo ./*.crt))"
  fi
  old_id=$(podman image inspect --format '{{.Id}}' "$IMAGE" 2>/dev/null || true)
  mapfile -t dangling_before < <(podman images -q --no-trunc --filter dangling=true)
  "${PODMAN[@]}" build --format docker --pull=never --network=host "${BUILD_VOLUMES[@]}" \
    -t "$IMAGE" -f "$TMP_CTX/Dockerfile" "$TMP_CTX" \
    || die "podman build failed (phase '$PHASE')"
  podman image ls --format '{{.Repository}}:{{.Tag}} {{.ID}} {{.Size}}' | grep -F "${IMAGE%%:*}" || true
  # Drop only what this build left behind: the previous $IMAGE (now untagged) and the new
  # untagged images of the src stage. Other images, and the layer cache, stay.
  new_id=$(podman image inspect --format '{{.Id}}' "$IMAGE")
  stale=()
  while read -r id; do
    [[ " ${dangling_before[*]} " == *" $id "* ]] || stale+=("$id")
  done < <(podman images -q --no-trunc --filter dangling=true)
  if [ -n "$old_id" ] && [ "$old_id" != "$new_id" ] && [[ " ${stale[*]} " != *" $old_id "* ]]; then
    stale+=("$old_id")
  fi
  if ((${#stale[@]})); then
    echo "removing ${#stale[@]} image(s) this build left untagged"
    podman rmi "${stale[@]}" >/dev/null 2>&1 || true
  fi
  phase_end
  rm -rf "$TMP_CTX" "$TMP_PIPCONF"; TMP_CTX="" TMP_PIPCONF=""
fi

# ---- 5. run ---------------------------------------------------------------------------------
if ((do_run)); then
  podman image exists "$IMAGE" || die "no image $IMAGE; build it first (without --run-only)"
  label="${CMD[*]}"; ((${#label} <= 60)) || label="${label:0:57}..."
  phase_start "podman run: $label"
  rc=0
  # The emulated network of tests/parallel/test_netemu.py (bench/netemu/) needs, beyond the
  # default capabilities: NET_ADMIN (veth, bridge, addresses, `tc qdisc`) and SYS_ADMIN
  # (`ip netns add` bind-mounts /run/netns/<ns> and makes it shared; `ip netns exec` unshares
  # the mount namespace and remounts /sys). Measured here: neither alone is enough, both are,
  # with the default seccomp profile. Where AppArmor is on (Ubuntu), its containers-default
  # profile denies every mount whatever the capabilities, hence apparmor=unconfined (a no-op
  # on a host without AppArmor, like this one). Less than --privileged: no devices, /proc/sys
  # and /sys stay read-only, seccomp stays on.
  "${PODMAN[@]}" run --rm --network=host --shm-size=1g \
    --ulimit nofile=20000:20000 --ulimit nproc=32768:32768 \
    --cap-add NET_ADMIN --cap-add SYS_ADMIN --security-opt apparmor=unconfined \
    "$IMAGE" "${CMD[@]}" || rc=$?
  phase_end
  ((rc == 0)) || die "command in the image exited with $rc: ${CMD[*]}"
fi
}
main "$@"
exit
