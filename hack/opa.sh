#!/usr/bin/env bash
# Makes the real `opa` binary available for the tests and benchmarks that compare the engine with it.
#
#   hack/opa.sh          build opa if missing, print the path of the binary
#
# opa is built from the Go module proxy at the version go.mod requires, so `opa test` and
# `opa run --server` run the same Rego as the controller. The binary lands in .cache/bin/, which git
# ignores, next to a stamp holding its version: a second run finds both and returns at once.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="${root}/.cache/bin"
module=github.com/open-policy-agent/opa

cd "${root}"
version="$(go list -m -f '{{.Version}}' "${module}")"
if [ -x "${bin}/opa" ] && [ "$(cat "${bin}/opa.version" 2>/dev/null)" = "${version}" ]; then
  echo "${bin}/opa"
  exit 0
fi

mkdir -p "${bin}"
echo "opa: building ${module} ${version} (a few minutes the first time)" >&2
# Build beside the target and rename, so a concurrent run never executes a half-written binary.
tmp="$(mktemp "${bin}/opa.XXXXXX")"
trap 'rm -f "${tmp}"' EXIT
CGO_ENABLED=0 go build -trimpath -o "${tmp}" "${module}"
mv -f "${tmp}" "${bin}/opa"
echo "${version}" > "${bin}/opa.version"
echo "${bin}/opa"
