#!/usr/bin/env bash
# Create one virtualenv per system under venvs/<name> from requirements/<name>.txt
# (exact versions used for docs/benchmarks.md).  Usage: ./setup_venvs.sh [name ...]
# awa_pool is installed editable from this checkout (the repository root), or
# from $AWA_POOL_SRC.
# Needs Python 3.11 (override with PYTHON=/path/to/python3.11).
set -euo pipefail
cd "$(dirname "$0")"
# awa_pool source: the checkout itself (editable) unless AWA_POOL_SRC names
# another tree (bench.sh sets it to a `git archive` snapshot with AWA_POOL_REF).
AWA_POOL_SRC="${AWA_POOL_SRC:-$(cd ../.. && pwd)}"
PY="${PYTHON:-python3.11}"
command -v "$PY" >/dev/null 2>&1 || PY=/root/.pyenv/versions/3.11.7/bin/python
names=("$@")
[ ${#names[@]} -eq 0 ] && names=(awa_pool awa procrastinate pgqueuer chancy)
for n in "${names[@]}"; do
  if [ ! -x "venvs/$n/bin/python" ]; then "$PY" -m venv "venvs/$n"; fi
  "venvs/$n/bin/pip" install -q -r "requirements/$n.txt"
  if [ "$n" = awa_pool ]; then "venvs/$n/bin/pip" install -q -e "$AWA_POOL_SRC"; fi
  echo "venvs/$n ready: $("venvs/$n/bin/python" --version)"
done
# every venv also needs psycopg2 (the driver's own DB access); it is in each requirements file.
