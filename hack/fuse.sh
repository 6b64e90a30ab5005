#!/usr/bin/env bash
# Makes the third-party FUSE mounter the reference driver can run (refdriver --mounter rclone)
# available, for the tests that mount volumes with it and for people:
#
#   hack/fuse.sh            install rclone and fusermount when missing, print rclone's version
#   hack/fuse.sh --check    say what is missing (exit 1), or nothing (exit 0)
#
# Both come from Debian's packages (apt-get, as root): rclone (rclone mount serves a local folder
# as a FUSE file system) and fuse3, whose fusermount3 (and its fusermount link) rclone mounts
# through: it runs `fusermount` from the PATH even as root. A second run finds both and returns
# at once. Without root, or without a package source, it says what to install and exits non-zero;
# the tests that need rclone then skip, or fail under CI=true.
set -euo pipefail

log() { echo "fuse: $*" >&2; }

missing() {
  local need=()
  command -v rclone >/dev/null 2>&1 || need+=(rclone)
  command -v fusermount >/dev/null 2>&1 || need+=(fuse3)
  echo "${need[*]}"
}

if [ "${1:-}" = "--check" ]; then
  need="$(missing)"
  if [ -n "${need}" ]; then
    echo "missing Debian package(s): ${need}"
    exit 1
  fi
  exit 0
fi

need="$(missing)"
if [ -n "${need}" ]; then
  if [ "$(id -u)" != 0 ]; then
    log "${need} missing, and installing needs root: apt-get install ${need}"
    exit 1
  fi
  if ! command -v apt-get >/dev/null; then
    log "${need} missing, and this machine has no apt-get to install them"
    exit 1
  fi
  # One installer at a time: parallel test runs may install too.
  exec 9>"${TMPDIR:-/tmp}/volume-healer-fuse-install.lock"
  flock 9
  need="$(missing)"
  if [ -n "${need}" ]; then
    log "installing ${need} from Debian's packages"
    export DEBIAN_FRONTEND=noninteractive
    # shellcheck disable=SC2086 # one word per package
    if ! { apt-get update -qq >&2 && apt-get install -y -qq --no-install-recommends ${need} >&2; }; then
      log "apt-get install ${need} failed"
      exit 1
    fi
  fi
fi
rclone version | head -n 1
