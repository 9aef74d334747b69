#!/usr/bin/env bash
# Downloads the pure-Python test wheels for one Pyodide runtime into the project's wheel cache.
#
# Usage: pyodide/fetch-wheels.sh 314|028 [DEST]
#   314 -> Python 3.14 wheels (pyodide/requirements-py314.txt) into .pyodide-wheels/py314
#   028 -> Python 3.13 wheels (pyodide/requirements-py313.txt) into .pyodide-wheels/py313
#
# Exact pins with hashes, no dependency resolution (--no-deps --require-hashes). Idempotent: does
# nothing (and touches no network) when DEST already holds the wheels of the current requirement
# files. A download goes to a temporary directory first, so a failed one never leaves a half cache.
# Uses the project's .venv pip (PYTHON=... to choose another interpreter that has pip).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")

runtime=${1:-}
case "$runtime" in
  314) pyver=3.14; platform=pyemscripten_2026_0_wasm32 ;;
  028) pyver=3.13; platform=pyodide_2025_0_wasm32 ;;
  *) echo "usage: $0 314|028 [DEST]" >&2; exit 2 ;;
esac
tag=py${pyver/./}
req="$here/requirements-$tag.txt"
dest=${2:-$root/.pyodide-wheels/$tag}
py=${PYTHON:-$root/.venv/bin/python}

# pytest and hypothesis must be the versions the CPython runs use.
for name in pytest hypothesis; do
  want=$(grep -E "^$name==" "$root/scripts/requirements-dev.txt" | sed -E 's/[[:space:]].*//')
  have=$(grep -E "^$name==" "$here/requirements-common.txt" | sed -E 's/[[:space:]].*//')
  if [ -z "$want" ] || [ "$want" != "$have" ]; then
    echo "fetch-wheels: pyodide/requirements-common.txt pins '${have:-nothing}' but scripts/requirements-dev.txt pins '${want:-nothing}' for $name" >&2
    exit 1
  fi
done

stamp_want=$(cat "$req" "$here/requirements-common.txt" | sha256sum | cut -c1-16)
if [ "$(cat "$dest/.stamp" 2>/dev/null)" = "$stamp_want" ]; then
  exit 0
fi

if ! "$py" -m pip --version >/dev/null 2>&1; then
  echo "fetch-wheels: $py has no pip (run scripts/venv, or set PYTHON)" >&2
  exit 1
fi
mkdir -p "$(dirname "$dest")"
tmp=$(mktemp -d "$(dirname "$dest")/.fetch-$tag.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
echo "fetch-wheels: downloading Python $pyver test wheels for Pyodide $runtime into $dest" >&2
(cd "$here" && "$py" -m pip download --quiet --disable-pip-version-check \
  --no-deps --require-hashes --only-binary=:all: \
  --python-version "$pyver" --platform "$platform" \
  -r "$req" -d "$tmp")

# Every pinned requirement must have produced exactly one wheel.
expected=$(cat "$req" "$here/requirements-common.txt" | grep -cE '^[A-Za-z0-9]')
got=$(find "$tmp" -maxdepth 1 -name '*.whl' | wc -l)
if [ "$expected" != "$got" ]; then
  echo "fetch-wheels: expected $expected wheels, got $got in $tmp" >&2
  exit 1
fi
chmod 755 "$tmp"
echo "$stamp_want" > "$tmp/.stamp"
rm -rf "$dest"
mv "$tmp" "$dest"
trap - EXIT
