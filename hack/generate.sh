#!/usr/bin/env bash
# Regenerates the Go code of the wire protocol from api/healer/v1alpha1/healer.proto.
#
#   hack/generate.sh            rewrite api/healer/v1alpha1/*.pb.go (what `make generate` runs)
#   hack/generate.sh --verify   fail when the committed files differ from what the .proto gives
#
# protoc comes from Debian's protobuf-compiler package (apt-get install -y protobuf-compiler); its
# version is checked because it is written into the generated files. The two protoc plugins are
# built from the Go module proxy at the versions pinned below into .cache/bin, which git ignores:
# protoc-gen-go at the google.golang.org/protobuf version that go.mod requires, protoc-gen-go-grpc
# at PROTOC_GEN_GO_GRPC_VERSION. Running the script twice produces byte-identical files.
set -euo pipefail

verify=false
case "${1:-}" in
  "") ;;
  --verify) verify=true ;;
  *) echo "usage: $0 [--verify]" >&2; exit 2 ;;
esac

PROTOC_VERSION="${PROTOC_VERSION:-3.21.12}"
PROTOC_GEN_GO_GRPC_VERSION="${PROTOC_GEN_GO_GRPC_VERSION:-v1.6.2}"

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="${root}/.cache/bin"
mkdir -p "${bin}"
cd "${root}"

log() { echo "generate: $*" >&2; }

if ! command -v protoc >/dev/null 2>&1; then
  log "protoc not found: install it with 'apt-get update && apt-get install -y protobuf-compiler'"
  exit 1
fi
have="$(protoc --version | awk '{print $2}')"
if [[ "${have}" != "${PROTOC_VERSION}" ]]; then
  log "protoc ${have} found, ${PROTOC_VERSION} expected (its version is written into the generated code);"
  log "install Debian's protobuf-compiler, or set PROTOC_VERSION=${have} to accept the difference"
  exit 1
fi

# Debian installs the well-known types (google/protobuf/*.proto) under /usr/include.
wkt_include=""
for dir in /usr/include /usr/local/include; do
  if [[ -f "${dir}/google/protobuf/duration.proto" ]]; then
    wkt_include="${dir}"
    break
  fi
done
if [[ -z "${wkt_include}" ]]; then
  log "google/protobuf/duration.proto not found under /usr/include or /usr/local/include: install libprotobuf-dev"
  exit 1
fi

# csi.proto sits at the root of the CSI spec module that go.mod requires.
csi_dir="$(go mod download -json github.com/container-storage-interface/spec | sed -n 's/^\s*"Dir": "\(.*\)",$/\1/p')"
if [[ ! -f "${csi_dir}/csi.proto" ]]; then
  log "csi.proto not found in the CSI spec module (looked in '${csi_dir}')"
  exit 1
fi

# protoc-gen-go belongs to the protobuf runtime's module, so go.mod pins its version. A stamp file
# names the version that was built, so that a go.mod bump rebuilds it.
protobuf_version="$(go list -m -f '{{.Version}}' google.golang.org/protobuf)"
stamp="${bin}/protoc-gen-go.${protobuf_version}"
if [[ ! -x "${bin}/protoc-gen-go" || ! -f "${stamp}" ]]; then
  log "building protoc-gen-go ${protobuf_version}"
  go build -o "${bin}/protoc-gen-go" google.golang.org/protobuf/cmd/protoc-gen-go
  rm -f "${bin}"/protoc-gen-go.v* && touch "${stamp}"
fi

# protoc-gen-go-grpc is a module of its own, so it is installed outside this module's go.mod.
stamp="${bin}/protoc-gen-go-grpc.${PROTOC_GEN_GO_GRPC_VERSION}"
if [[ ! -x "${bin}/protoc-gen-go-grpc" || ! -f "${stamp}" ]]; then
  log "installing protoc-gen-go-grpc ${PROTOC_GEN_GO_GRPC_VERSION}"
  GOBIN="${bin}" go install "google.golang.org/grpc/cmd/protoc-gen-go-grpc@${PROTOC_GEN_GO_GRPC_VERSION}"
  rm -f "${bin}"/protoc-gen-go-grpc.v* && touch "${stamp}"
fi

log "protoc ${have}, protoc-gen-go ${protobuf_version}, protoc-gen-go-grpc ${PROTOC_GEN_GO_GRPC_VERSION}"
out="$(mktemp -d)"
trap 'rm -rf "${out}"' EXIT
# --proto_path=api makes the file register as healer/v1alpha1/healer.proto; csi.proto is found
# under the name its own Go bindings register ("csi.proto").
PATH="${bin}:${PATH}" protoc \
  --proto_path=api \
  --proto_path="${csi_dir}" \
  --proto_path="${wkt_include}" \
  --go_out="${out}" --go_opt=paths=source_relative \
  --go-grpc_out="${out}" --go-grpc_opt=paths=source_relative \
  healer/v1alpha1/healer.proto

generated=(healer/v1alpha1/healer.pb.go healer/v1alpha1/healer_grpc.pb.go)
if [[ "${verify}" == true ]]; then
  stale=0
  for f in "${generated[@]}"; do
    if ! cmp -s "${out}/${f}" "api/${f}"; then
      log "api/${f} is out of date: run hack/generate.sh"
      stale=1
    fi
  done
  if [[ "${stale}" == 0 ]]; then
    log "generated code is up to date"
  fi
  exit "${stale}"
fi
for f in "${generated[@]}"; do
  cp "${out}/${f}" "api/${f}"
done
log "wrote api/healer/v1alpha1/healer.pb.go and healer_grpc.pb.go"
