# Sourced by the scripts that build commands of k8s.io/kubernetes from the Go module proxy
# (control-plane.sh, node.sh, tools.sh).

# kubernetes_build <out folder> <version> <command package>...
#
# Builds the commands, static, into the out folder, from a throwaway module in the current folder
# that requires k8s.io/kubernetes at version and replaces each of its staging modules by the
# published version (v1.X.Y publishes them as v0.X.Y): `go install pkg@version` cannot, for the
# replace directives of its go.mod. The binaries carry the version as Kubernetes' release builds
# do (--version, and the version the API server reports).
kubernetes_build() {
  local out="$1" version="$2"
  shift 2
  export GOFLAGS=-buildvcs=false
  [ -f go.mod ] || go mod init build-kubernetes >/dev/null 2>&1
  local modfile staging="v0.${version#v1.}"
  modfile="$(go mod download -json "k8s.io/kubernetes@${version}" | sed -n 's/.*"GoMod": "\(.*\)",/\1/p')"
  {
    echo "require k8s.io/kubernetes ${version}"
    echo "replace ("
    sed -n 's#^\s*\(k8s.io/[a-z0-9-]*\) => ./staging/src/.*#\t\1 => \1 '"${staging}"'#p' "${modfile}"
    echo ")"
  } >>go.mod
  {
    printf '//go:build tools\n\npackage tools\n\nimport (\n'
    local pkg
    for pkg in "$@"; do printf '\t_ "%s"\n' "${pkg}"; done
    printf ')\n'
  } >tools.go
  go mod tidy >/dev/null 2>&1 || true
  local minor="${version#v1.}"
  minor="${minor%%.*}"
  local v=k8s.io/component-base/version
  mkdir -p "${out}"
  CGO_ENABLED=0 go build -trimpath -o "${out}/" \
    -ldflags "-s -w -X ${v}.gitVersion=${version} -X ${v}.gitMajor=1 -X ${v}.gitMinor=${minor}" "$@" >&2
}
