#!/usr/bin/env bash
# Makes podman ready to run the project's images, for the image tests and for people:
#
#   hack/podman.sh      install podman and runc when missing, write the containers.conf they need,
#                       print the path of that file (export it as CONTAINERS_CONF)
#
# podman and runc come from Debian's packages (apt-get, as root). runc rather than crun: crun
# refuses the hybrid cgroup layout (cgroup v1 controllers with a v2 "unified" hierarchy) of some
# machines, runc runs there. The containers.conf empties default_ulimits: podman raises the
# container's open-files limit by default, which a process that may not raise its own limits
# (inside another container, say) cannot do. Run the images with
#
#   CONTAINERS_CONF="$(hack/podman.sh)" podman --runtime runc --cgroup-manager=cgroupfs \
#     run --rm --network none IMAGE --version
#
# A second run finds both installed and returns at once. It exits non-zero, saying why on stderr,
# when podman is missing and cannot be installed (not root, no apt-get, no package source).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
conf="${root}/.cache/podman/containers.conf"

log() { echo "podman: $*" >&2; }

if ! command -v podman >/dev/null || ! command -v runc >/dev/null; then
  if [ "$(id -u)" != 0 ]; then
    log "podman or runc is missing and installing them needs root: apt-get install podman runc"
    exit 1
  fi
  if ! command -v apt-get >/dev/null; then
    log "podman or runc is missing and this machine has no apt-get to install them"
    exit 1
  fi
  log "installing podman and runc from Debian's packages"
  # One installer at a time: parallel test packages may call this together.
  mkdir -p "$(dirname "${conf}")"
  exec 9>"$(dirname "${conf}")/install.lock"
  flock 9
  if ! command -v podman >/dev/null || ! command -v runc >/dev/null; then
    if ! apt-get update -qq >&2; then
      log "apt-get update failed: no package source reachable"
      exit 1
    fi
    if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends podman runc >&2; then
      log "apt-get install podman runc failed"
      exit 1
    fi
  fi
fi

mkdir -p "$(dirname "${conf}")"
want='[containers]
default_ulimits = []'
if [ ! -f "${conf}" ] || [ "$(cat "${conf}")" != "${want}" ]; then
  printf '%s\n' "${want}" >"${conf}.tmp"
  mv "${conf}.tmp" "${conf}"
fi
echo "${conf}"
