#!/usr/bin/env bash
# Create one virtualenv per system under venvs/<name> from requirements/<name>.txt
# (exact versions used for docs/benchmarks.md).  Usage: ./setup_venvs.sh [name ...]
# awa_pool is installed editable from this checkout (the repository root), or
# from $AWA_POOL_SRC.  `limit` is the venv of the limit rows (sql_bare,
# process_pool): psycopg2 alone.
# Needs Python 3.11 (override with PYTHON=/path/to/python3.11).
set -euo pipefail
cd "$(dirname "$0")"
# awa_pool source: the checkout itself (editable) unless AWA_POOL_SRC names
# another tree (bench.sh sets it to a `git archive` snapshot with AWA_POOL_REF).
AWA_POOL_SRC="${AWA_POOL_SRC:-$(cd ../.. && pwd)}"
PY="${PYTHON:-python3.11}"
command -v "$PY" >/dev/null 2>&1 || PY=/root/.pyenv/versions/3.11.7/bin/python
names=("$@")
[ ${#names[@]} -eq 0 ] && names=(awa_pool awa procrastinate pgqueuer chancy celery oban dbos limit)
for n in "${names[@]}"; do
  # A requirements file may pin another interpreter with a first-lines comment
  # "# python: X.Y" (oban needs >= 3.12); otherwise $PY (3.11) is used.
  py="$PY"
  want=$(sed -n 's/^# *python: *\([0-9][0-9.]*\).*/\1/p' "requirements/$n.txt" | head -1)
  if [ -n "$want" ]; then
    py="python$want"
    if ! "$py" --version >/dev/null 2>&1; then
      py=$(ls -d /root/.pyenv/versions/"$want".*/bin/python 2>/dev/null | sort -V | tail -1)
    fi
    [ -n "$py" ] && "$py" --version >/dev/null 2>&1 || { echo "no python $want for $n" >&2; exit 1; }
  fi
  if [ ! -x "venvs/$n/bin/python" ]; then "$py" -m venv "venvs/$n"; fi
  "venvs/$n/bin/pip" install -q -r "requirements/$n.txt"
  if [ "$n" = awa_pool ]; then "venvs/$n/bin/pip" install -q -e "$AWA_POOL_SRC"; fi
  echo "venvs/$n ready: $("venvs/$n/bin/python" --version)"
done
# every venv also needs psycopg2 (the driver's own DB access); it is in each requirements file.
