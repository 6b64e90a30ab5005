#!/usr/bin/env bash
# Makes the deployment tools available for the tests of deploy/ and for people, the linter for
# make lint, and kubectl for the end-to-end test of the policy webhook where none is installed.
#
#   hack/tools.sh                      build every tool but kubectl that is missing, print one path per line
#   hack/tools.sh promtool helm        the same for the tools named, in that order
#
# Tools and where they come from (all built from the Go module proxy, at the versions pinned here,
# with the dependency versions each tool's own go.mod pins):
#
#   promtool    github.com/prometheus/prometheus/cmd/promtool   PROMETHEUS_VERSION  check and unit-test the alert rules
#               (taken from Debian's prometheus package, unpacked, when apt-get can download it:
#               seconds instead of a ten-minute build; PROMTOOL_FROM_SOURCE=true builds it)
#   helm        helm.sh/helm/v3/cmd/helm                        HELM_VERSION        render the chart (helm template, helm lint)
#   kustomize   sigs.k8s.io/kustomize/kustomize/v5              KUSTOMIZE_VERSION   render the kustomize base and overlays
#   staticcheck honnef.co/go/tools/cmd/staticcheck              STATICCHECK_VERSION lint the Go code (make lint)
#   kubectl     k8s.io/kubernetes/cmd/kubectl                   KUBECTL_VERSION     apply a policy through the webhook as an operator does (test/e2e)
#
# The deployment tests send the rendered manifests to the API server from Go; the end-to-end test
# of the policy webhook runs kubectl, the one on the PATH when there is one, else this one. Where a
# kubectl is installed, `kubectl kustomize` renders the same output as kustomize. kubectl is built
# like hack/control-plane.sh builds kube-apiserver: k8s.io/kubernetes with every staging module
# replaced by its published version (go install cannot, for the replace directives of its go.mod).
#
# The binaries land in .cache/bin/ (git ignored), each next to a stamp holding its version: a
# second run finds both and returns at once. A first run takes several minutes on 2 cores.
set -euo pipefail

PROMETHEUS_VERSION="${PROMETHEUS_VERSION:-v0.316.0}"
HELM_VERSION="${HELM_VERSION:-v3.22.0}"
KUSTOMIZE_VERSION="${KUSTOMIZE_VERSION:-v5.8.2}"
# Needs Go 1.26 or newer (its go.mod says go 1.26.0), as this project's go.mod does.
STATICCHECK_VERSION="${STATICCHECK_VERSION:-v0.8.2}"
# The control plane's version (hack/control-plane.sh), so that client and server agree.
KUBECTL_VERSION="${KUBECTL_VERSION:-v1.37.2}"

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="${root}/.cache/bin"
mkdir -p "${bin}"

log() { echo "tools: $*" >&2; }

# package and version of each tool, and the -X flag that stamps the version into the binary.
pkg_of() {
  case "$1" in
    promtool) echo "github.com/prometheus/prometheus/cmd/promtool" ;;
    helm) echo "helm.sh/helm/v3/cmd/helm" ;;
    kustomize) echo "sigs.k8s.io/kustomize/kustomize/v5" ;;
    staticcheck) echo "honnef.co/go/tools/cmd/staticcheck" ;;
    kubectl) echo "k8s.io/kubernetes/cmd/kubectl" ;;
    *) return 1 ;;
  esac
}
version_of() {
  case "$1" in
    promtool) echo "${PROMETHEUS_VERSION}" ;;
    helm) echo "${HELM_VERSION}" ;;
    kustomize) echo "${KUSTOMIZE_VERSION}" ;;
    staticcheck) echo "${STATICCHECK_VERSION}" ;;
    kubectl) echo "${KUBECTL_VERSION}" ;;
  esac
}
ldflags_of() {
  local v="$2"
  case "$1" in
    # Prometheus v0.3XY.Z is Prometheus 3.XY.Z.
    promtool)
      local rest="${v#v0.3}"
      echo "-X github.com/prometheus/common/version.Version=3.$((10#${rest%%.*})).${rest#*.}" ;;
    helm)
      # helm template and helm lint assume the Kubernetes version of helm's own client-go, as
      # helm's release builds do; without it they would assume 1.20.
      local gomod minor
      # Outside any module, so that this project's go.mod and go.sum stay as they are.
      gomod="$(cd "${TMPDIR:-/tmp}" && GOFLAGS= go mod download -json "helm.sh/helm/v3@${v}" | sed -n 's/.*"GoMod": "\(.*\)",/\1/p')"
      minor="$(sed -n 's#^[[:space:]]*k8s.io/client-go v0\.\([0-9]*\)\..*#\1#p' "${gomod}" | head -n 1)"
      echo "-X helm.sh/helm/v3/internal/version.version=${v}" \
        "-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=${minor}" \
        "-X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=${minor}" ;;
    kustomize) echo "-X sigs.k8s.io/kustomize/api/provenance.version=${v}" ;;
    # staticcheck carries its version in its source.
    staticcheck) ;;
    # kubectl is stamped by kubernetes_build (hack/lib/kubernetes.sh).
  esac
}

# shellcheck source=hack/lib/kubernetes.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib/kubernetes.sh"

# build_kubernetes_command builds a command of k8s.io/kubernetes at version into the folder work.
build_kubernetes_command() {
  local work="$1" pkg="$2" version="$3"
  (cd "${work}" && kubernetes_build "${work}" "${version}" "${pkg}")
}

# promtool_from_debian puts the promtool of Debian's prometheus package into the work folder: the
# package is downloaded and unpacked, not installed (no service is set up). It takes seconds where
# building promtool takes about ten minutes; promtool 2.42 checks and unit-tests these rules the
# same way. It fails where apt-get cannot download, and the caller builds promtool instead.
promtool_from_debian() {
  local work="$1"
  command -v apt-get >/dev/null 2>&1 && command -v dpkg-deb >/dev/null 2>&1 || return 1
  (
    cd "${work}"
    apt-get download prometheus >/dev/null 2>&1 || { apt-get update -qq >/dev/null 2>&1 && apt-get download prometheus >/dev/null 2>&1; } || exit 1
    dpkg-deb -x prometheus_*.deb pkg && mv pkg/usr/bin/promtool promtool && rm -rf pkg prometheus_*.deb
  ) || return 1
  "${work}/promtool" --version >/dev/null 2>&1
}

build() {
  local tool="$1" pkg version
  pkg="$(pkg_of "${tool}")"
  version="$(version_of "${tool}")"
  if [ -x "${bin}/${tool}" ] && [ "$(cat "${bin}/${tool}.version" 2>/dev/null)" = "${version}" ]; then
    return
  fi
  # A throwaway GOBIN beside the target: a concurrent run never executes a half-written binary,
  # and go.mod of this project is never touched (go install pkg@version builds in module mode
  # with the tool's own go.mod).
  local work
  work="$(mktemp -d "${bin}/.build-${tool}.XXXXXX")"
  if [ "${tool}" = promtool ] && [ "${PROMTOOL_FROM_SOURCE:-}" != true ] && promtool_from_debian "${work}"; then
    log "promtool: $("${work}/promtool" --version 2>&1 | head -n 1), from Debian's prometheus package"
  elif [ "${tool}" = kubectl ]; then
    log "building kubectl ${version} from the Go module proxy (a few minutes the first time)"
    if ! build_kubernetes_command "${work}" "${pkg}" "${version}"; then
      rm -rf "${work}"
      log "building ${pkg}@${version} failed (the go output above says why)"
      return 1
    fi
  elif ! log "building ${tool} ${version} from the Go module proxy (a few minutes the first time)" ||
    ! (cd "${work}" && GOBIN="${work}" GOFLAGS=-buildvcs=false CGO_ENABLED=0 \
    go install -trimpath -ldflags "-s -w $(ldflags_of "${tool}" "${version}")" "${pkg}@${version}" >&2); then
    rm -rf "${work}"
    log "building ${pkg}@${version} failed (the go output above says why)"
    return 1
  fi
  mv -f "${work}/$(basename "${pkg%/v[0-9]}")" "${bin}/${tool}"
  rm -rf "${work}"
  echo "${version}" > "${bin}/${tool}.version"
}

tools=("$@")
[ "${#tools[@]}" -gt 0 ] || tools=(promtool helm kustomize staticcheck)
for tool in "${tools[@]}"; do
  if ! pkg_of "${tool}" >/dev/null; then
    log "unknown tool ${tool}; known: promtool helm kustomize staticcheck kubectl"
    exit 2
  fi
done

# One build at a time per checkout: tests of several packages may ask at once.
if command -v flock >/dev/null 2>&1; then
  exec 9>"${bin}/.tools.lock"
  flock 9
fi
for tool in "${tools[@]}"; do
  build "${tool}"
  echo "${bin}/${tool}"
done
