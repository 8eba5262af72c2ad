#!/usr/bin/env bash
# Installs everything Compute Broker needs (idempotent).
#   bash scripts/bootstrap.sh          runtime only (demo)
#   bash scripts/bootstrap.sh test     runtime + test/bench tools + redis-server + chromium
#                                      + the Kubernetes control plane the tests start
#
# Two layers, so a machine that is reused never downloads torch twice:
#  * a shared *base* venv, keyed by Python and torch version, that holds torch==2.13.0
#    (PyPI's CUDA build: several GB, it runs on the CPU here) and every third-party
#    dependency. As root it lives in /var/cache/compute-broker (readable by the
#    unprivileged job users the agent runs ranks as); otherwise in ~/.cache/compute-broker.
#    CB_VENV_CACHE overrides the directory.
#  * this checkout's own light ./.venv: a venv whose site-packages points at the base
#    (a .pth file) and that holds only this checkout, installed editable.
# torch is pinned here: an unpinned torch drifts to whatever PyPI serves that day.
set -euo pipefail
cd "$(dirname "$0")/.."
TORCH=2.13.0

# The interpreter: the system's Python 3.11+ when there is one (every user of the host can
# run it, which per-job Unix identities need), else python3 on PATH. PYTHON overrides.
pick_python() {
  if [ -n "${PYTHON:-}" ]; then echo "$PYTHON"; return; fi
  for p in /usr/bin/python3 python3; do
    if command -v "$p" >/dev/null 2>&1 && "$p" -c 'import sys, venv, ensurepip; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
      echo "$p"; return
    fi
  done
  echo "no Python >= 3.11 with the venv module found: install python3.11 (Debian: apt-get install python3 python3-venv) or set PYTHON" >&2
  exit 1
}
PY=$(pick_python)
PYVER=$("$PY" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}.{sys.version_info[2]}")')
if [ -n "${CB_VENV_CACHE:-}" ]; then CACHE=$CB_VENV_CACHE
elif [ "$(id -u)" = 0 ]; then CACHE=/var/cache/compute-broker
else CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/compute-broker
fi
BASE="$CACHE/base-py$PYVER-torch$TORCH"
mkdir -p "$CACHE"
[ "$(id -u)" = 0 ] && chmod 755 "$CACHE"

extra="s3demo"  # moto[server]: `brokerctl demo --s3` runs a local S3 API server
[ "${1:-}" = "test" ] && extra="test,s3demo"

# One installer at a time per cache (several checkouts may bootstrap at once).
exec 9>"$CACHE/.lock"
flock 9

if [ ! -x "$BASE/bin/python" ]; then
  echo ">> creating the shared base venv $BASE"
  "$PY" -m venv "$BASE"
  "$BASE/bin/python" -m pip install -q --upgrade pip >/dev/null
fi
if ! "$BASE/bin/python" -c "import torch" 2>/dev/null; then
  echo ">> installing torch==$TORCH into the base venv (first time only: a CUDA build of"
  echo "   several GB from PyPI; 5-15 minutes on a fresh machine, it runs on the CPU here)"
  "$BASE/bin/python" -m pip install --progress-bar on "torch==$TORCH"
fi
# Third-party dependencies go into the base when pyproject's list changes (a stamp).
stamp="$BASE/.deps-$extra-$(sha256sum pyproject.toml | cut -c1-16)"
if [ ! -e "$stamp" ]; then
  echo ">> installing dependencies [$extra] into the base venv"
  deps=$("$BASE/bin/python" - "$extra" <<'EOF'
import sys, tomllib
p = tomllib.load(open("pyproject.toml", "rb"))["project"]
out = [d for d in p["dependencies"] if not d.startswith("torch")]
for e in sys.argv[1].split(","):
    out += p["optional-dependencies"][e]
print("\n".join(out))
EOF
)
  printf '%s\n' "$deps" > "$BASE/.requirements"
  "$BASE/bin/python" -m pip install -q -r "$BASE/.requirements" "torch==$TORCH"
  touch "$stamp"
fi
flock -u 9

if [ "${1:-}" = "test" ]; then
  # Debian packages: redis-server (HA store tests), iproute2, chromium (console tests: Playwright
  # drives it at /usr/bin/chromium; no browser is ever downloaded by `playwright install`).
  missing=""
  command -v redis-server >/dev/null 2>&1 || missing="$missing redis-server"
  command -v redis-sentinel >/dev/null 2>&1 || missing="$missing redis-sentinel"
  [ -x /usr/bin/chromium ] || missing="$missing chromium"
  # iproute2: `ip netns` for the tests that put brokers, front-ends and agents on
  # separate network hosts (tests/fixtures/netns.py); a slim image may lack it.
  command -v ip >/dev/null 2>&1 || missing="$missing iproute2"
  if [ -n "$missing" ]; then
    echo ">> installing$missing (Debian packages)"
    if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
    $SUDO apt-get update -qq >/dev/null
    # shellcheck disable=SC2086
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing >/dev/null
  fi
fi

# This checkout's light venv over the base.
if [ ! -x .venv/bin/python ] || ! grep -qs "$BASE" .venv/.cb-base; then
  echo ">> creating ./.venv over $BASE"
  rm -rf .venv
  "$PY" -m venv .venv
  site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  bsite=$("$BASE/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  # addsitedir (not a bare path line) so the base's own .pth files are processed too.
  echo "import site; site.addsitedir('$bsite')" > "$site/zz_cb_base.pth"
  echo "$BASE" > .venv/.cb-base
  # The base's console scripts (ruff, moto_server, ...) beside ours.
  for f in "$BASE"/bin/*; do
    case "$f" in */__pycache__) continue ;; esac
    n=$(basename "$f")
    [ -e ".venv/bin/$n" ] || ln -s "$f" ".venv/bin/$n"
  done
fi
echo ">> installing compute-broker (editable) into ./.venv"
.venv/bin/python -m pip install -q --no-deps --no-build-isolation -e . 2>/dev/null \
  || .venv/bin/python -m pip install -q --no-deps -e .
