#!/usr/bin/env bash
# One command to reproduce docs/benchmarks.md: build the venvs, record the
# machine, measure the SQL-only ceiling, run every workload for awa_pool, its
# peers and the limit rows (interleaved, same session), measure the ceiling
# again.
#
#   scripts/bench/bench.sh                      # all systems, all workloads, 3 reps
#   REPS=1 scripts/bench/bench.sh               # quicker
#   SYSTEMS=awa_pool,pgqueuer WORKLOADS=W2,W3 scripts/bench/bench.sh
#   SMOKE=1 scripts/bench/bench.sh              # tiny N, 1 rep: checks the set-up only
#   AWA_POOL_REF=HEAD scripts/bench/bench.sh    # measure a frozen commit, not the live tree
#   scripts/bench/bench.sh --cfg 'awa_pool={"processes":1,"workers":1}'   # extra run.py args
#
# Needs: Python 3.11 (PYTHON=...) and 3.12 (oban), PyPI, PostgreSQL at
# 127.0.0.1:5432, user postgres, trust auth (BENCH_PG_HOST/PORT/USER override
# the driver's connection; psql and pgbench are used for the SQL ceiling), and
# Redis at 127.0.0.1:6379 for Celery (its adapter FLUSHDBs DB 7 only). The
# harness creates and DROPS its own databases bench_<system> and limitdb.
set -euo pipefail
cd "$(dirname "$0")"

SYSTEMS="${SYSTEMS:-awa_pool,awa,procrastinate,pgqueuer,chancy,celery,oban,dbos,sql_bare,process_pool}"
WORKLOADS="${WORKLOADS:-all}"
REPS="${REPS:-3}"
TAG="${TAG:-}"
PY="${PYTHON:-python3.11}"
command -v "$PY" >/dev/null 2>&1 || PY=/root/.pyenv/versions/3.11.7/bin/python
export PYTHON="$PY"
PGH="-h ${BENCH_PG_HOST:-127.0.0.1} -p ${BENCH_PG_PORT:-5432} -U ${BENCH_PG_USER:-postgres}"

# 1. venvs (idempotent: pip only installs what is missing).
# AWA_POOL_REF=<git ref> measures a frozen snapshot of that commit instead of
# the live working tree (other people's half-saved edits cannot leak into a
# run); the snapshot goes to venvs/awa_pool-src and records its commit.
if [ -n "${AWA_POOL_REF:-}" ]; then
  sha="$(git -C ../.. rev-parse --verify "$AWA_POOL_REF^{commit}")"
  rm -rf venvs/awa_pool-src && mkdir -p venvs/awa_pool-src
  git -C ../.. archive "$sha" | tar -x -C venvs/awa_pool-src
  echo "$sha" > venvs/awa_pool-src/BENCH_SOURCE
  export AWA_POOL_SRC="$PWD/venvs/awa_pool-src"
  rm -rf venvs/awa_pool   # re-point the editable install at the snapshot
fi
# AWA_POOL_VARIANTS="awa_pool_base=<ref> awa_pool_same=<ref> awa_pool_x=<ref>+<patch>":
# more awa_pool systems, each a `git archive` snapshot of its ref (with a
# patch from variants/ applied, for a one-line experiment) in a venv of its
# own, measured beside awa_pool in the same interleaved run: a bracketed A/B,
# where a variant of the same commit as awa_pool is the run's control.
for variant in ${AWA_POOL_VARIANTS:-}; do
  vname="${variant%%=*}"; vspec="${variant#*=}"
  vref="${vspec%%+*}"; vpatch=""; [ "$vspec" != "$vref" ] && vpatch="${vspec#*+}"
  vsha="$(git -C ../.. rev-parse --verify "$vref^{commit}")"
  rm -rf "venvs/$vname-src" "venvs/$vname" && mkdir -p "venvs/$vname-src"
  git -C ../.. archive "$vsha" | tar -x -C "venvs/$vname-src"
  [ -n "$vpatch" ] && patch -s -p1 -d "venvs/$vname-src" < "$vpatch"
  echo "$vsha${vpatch:+ + $vpatch}" > "venvs/$vname-src/BENCH_SOURCE"
  "$PY" -m venv "venvs/$vname"
  "venvs/$vname/bin/pip" install -q -r requirements/awa_pool.txt
  "venvs/$vname/bin/pip" install -q -e "venvs/$vname-src"
  echo "venvs/$vname ready: $vref = $vsha"
done
IFS=, read -r -a names <<<"$SYSTEMS"
venvs=()
for s in "${names[@]}"; do
  case "$s" in awa_sync) v=awa ;; sql_bare|process_pool) v=limit ;; awa_pool_*) continue ;; *) v="$s" ;; esac
  [[ " ${venvs[*]} " == *" $v "* ]] || venvs+=("$v")
done
./setup_venvs.sh "${venvs[@]}"

# 2. the database must be reachable before anything is timed
psql $PGH -d postgres -Atqc "select 1" >/dev/null || {
  echo "bench.sh: cannot reach PostgreSQL ($PGH); start it first" >&2; exit 2; }

mkdir -p results
stamp="$(date +%Y%m%d-%H%M%S)${TAG:+-$TAG}"
envf="results/env-$stamp.txt"
{
  echo "date: $(date -Is)"
  echo "nproc: $(nproc)"
  echo "mem: $(free -h | awk '/^Mem:/{print $2}')"
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')"
  echo "kernel: $(uname -r)"
  echo "python: $("$PY" --version 2>&1)"
  echo "postgres: $(psql $PGH -d postgres -Atqc 'select version()')"
  for k in shared_buffers synchronous_commit max_connections wal_level fsync; do
    echo "pg.$k: $(psql $PGH -d postgres -Atqc "show $k")"
  done
  echo "awa_pool source: ${AWA_POOL_SRC:-$(cd ../.. && pwd) (working tree, editable)} ${AWA_POOL_REF:+(snapshot of $AWA_POOL_REF = $sha)}"
  echo "awa_pool HEAD: $(git -C ../.. rev-parse --short HEAD 2>/dev/null || echo '?'), modified files: $(git -C ../.. status --porcelain -- awa_pool schema 2>/dev/null | wc -l)"
  if command -v redis-cli >/dev/null; then
    echo "redis (celery's broker): $(redis-cli -h 127.0.0.1 info server | tr -d '\r' | awk -F: '/^redis_version/{print "version " $2}'), appendonly $(redis-cli -h 127.0.0.1 config get appendonly | tail -1), save '$(redis-cli -h 127.0.0.1 config get save | tail -1)'"
  fi
  echo "loadavg before: $(cat /proc/loadavg)"
  for v in "${venvs[@]}"; do
    echo "venv $v: $("venvs/$v/bin/pip" freeze 2>/dev/null | grep -iE '^(-e |awa|procrastinate|pgqueuer|chancy|celery|redis|oban|dbos|psycopg2-binary)' | tr '\n' ' ')"
  done
} | tee "$envf"

ceiling() {
  if command -v pgbench >/dev/null && command -v psql >/dev/null; then
    bash limit/run.sh 8 | tee -a "$envf"
  else
    echo "sql_ceiling_jobs_per_s skipped (psql/pgbench not installed)" | tee -a "$envf"
  fi
}

# 3. SQL ceiling, the comparison, SQL ceiling again (same session)
echo "[ceiling before]" | tee -a "$envf"; ceiling
extra=()
if [ -n "${SMOKE:-}" ]; then
  REPS=1
  extra=(--n-w1a 1000 --n-w1b 2000 --n-w2 2000 --n-w3 60 --n-w4 50 --n-w5 600 --n-w6 40)
  [ -n "$TAG" ] || stamp="$stamp-smoke"
fi
"$PY" run.py --systems "$SYSTEMS" --workloads "$WORKLOADS" --reps "$REPS" \
  ${TAG:+--tag "$TAG"} "${extra[@]}" "$@" 2>&1 | tee "results/run-$stamp.log"
echo "[ceiling after]" | tee -a "$envf"; ceiling
echo "loadavg after: $(cat /proc/loadavg)" | tee -a "$envf"
echo "environment: $envf   log: results/run-$stamp.log"
