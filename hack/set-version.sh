#!/usr/bin/env bash
# Sets the release version everywhere it is written: the VERSION file (which the binaries and
# images are stamped with), the Helm charts' version and appVersion, and the image tags of the
# kustomize base and the sidecar component. test/deploy checks that they agree.
#
#   hack/set-version.sh 0.2.0
set -euo pipefail

v="${1:-}"
if ! [[ "${v}" =~ ^[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$ ]]; then
  echo "usage: hack/set-version.sh MAJOR.MINOR.PATCH[-PRERELEASE] (without the v), such as 0.2.0" >&2
  exit 1
fi
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${root}"

echo "${v}" >VERSION
for chart in deploy/helm/volume-healer deploy/helm/healer-refdriver; do
  sed -i -E "s/^version: .*/version: ${v}/; s/^appVersion: .*/appVersion: v${v}/" "${chart}/Chart.yaml"
done
sed -i -E "s#(image: volume-healer):v[^[:space:]]+#\1:v${v}#" deploy/base/deployment.yaml
sed -i -E "s#(image: healer-sidecar):v[^[:space:]]+#\1:v${v}#" deploy/sidecar/daemonset-patch.yaml
echo "version ${v}: VERSION, deploy/helm/{volume-healer,healer-refdriver}/Chart.yaml, deploy/base/deployment.yaml, deploy/sidecar/daemonset-patch.yaml"
