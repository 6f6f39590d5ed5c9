#!/usr/bin/env bash
# Every GPU table in one prepared run (issue #37): at most 8 minutes of wall time,
# installs included. Usage, from anywhere:
#
#   benchmarks/gpu.sh [--dry-run] [--out DIR]
#
# 1. Install: the machine's own JAX if it sees a GPU; Python wheels carried in the repo's
#    .whl/ (pip download ..., see /work/.library/device/README.md) go first on the path
#    (numpyro >= 0.22 where the image has an older one); with a network and no GPU JAX,
#    pip install "jax[cuda12]". The library itself runs from the checkout (PYTHONPATH).
# 2. Check: jax.devices() must list a GPU (not in --dry-run).
# 3. Parts, each under its own cap (timeout), in this order: env, gibbs, mapdp,
#    subcluster, chains, ddt, auxiliary. Each part writes its rows as it measures them
#    (DIR/<part>.jsonl), so a part stopped at its cap keeps the sizes it reached.
# 4. Report: DIR/gpu.md and DIR/gpu.json; the log is DIR/gpu.log.
#
# --dry-run: the same code paths at tiny sizes on the CPU (JAX_PLATFORMS=cpu), no
# installs, caps of 60-90 s, and after env two parts at a time (their times mean nothing
# there); the suite runs it (tests/test_gpu_script.py).
set -uo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
DRY=0
OUT="$REPO/benchmarks/results/gpu"
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) DRY=1 ;;
    --out) OUT="$2"; shift ;;
    *) echo "gpu.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
mkdir -p "$OUT"
rm -f "$OUT"/*.jsonl
LOG="$OUT/gpu.log"
: > "$LOG"
START=$(date +%s)
say() { echo "[gpu.sh $(( $(date +%s) - START ))s] $*" | tee -a "$LOG"; }
PY="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1
export JAXBNP_CACHE_DIR="$(mktemp -d)"  # an empty persistent cache: "first" is a cold compile

if [ "$DRY" = 1 ]; then
  export JAX_PLATFORMS=cpu
  PY="${PYTHON:-python}"
  DRY_LANE_1="chains:90 gibbs:60 ddt:60"  # the parts after env, in two lanes (below)
  DRY_LANE_2="mapdp:60 subcluster:60 auxiliary:60"
  CAPS="env:20 $DRY_LANE_1 $DRY_LANE_2"
  DRYFLAG=--dry-run
else
  DRYFLAG=
  # part caps in seconds: 6.5 minutes of benchmarks, leaving 1.5 for installs and report
  CAPS="env:20 gibbs:40 mapdp:65 subcluster:80 chains:80 ddt:60 auxiliary:45"
  if [ -d "$REPO/.whl" ] && ls "$REPO"/.whl/*.whl >/dev/null 2>&1; then
    say "installing the carried wheels ($(ls "$REPO"/.whl/*.whl | wc -l))"
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/jaxbnp-site "$REPO"/.whl/*.whl >>"$LOG" 2>&1 || say "wheel install failed"
    export PYTHONPATH="/tmp/jaxbnp-site${PYTHONPATH:+:$PYTHONPATH}"
  fi
  if ! "$PY" -c "import jax, sys; sys.exit(jax.default_backend() != 'gpu')" >>"$LOG" 2>&1; then
    say "no GPU JAX: trying pip install jax[cuda12] (needs a network)"
    timeout 120 "$PY" -m pip install -q "jax[cuda12]" >>"$LOG" 2>&1 || say "pip install failed"
  fi
fi
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
"$PY" -c "import jax, numpyro; print('devices', jax.devices(), 'jax', jax.__version__, 'numpyro', numpyro.__version__)" 2>&1 | tee -a "$LOG"
if [ "$DRY" = 0 ] && ! "$PY" -c "import jax, sys; sys.exit(jax.default_backend() != 'gpu')"; then
  say "jax.devices() lists no GPU: stopping (use --dry-run on a CPU)"
  exit 1
fi

# run_part NAME CAP: one part under its cap; its output goes to DIR/NAME.log, then to the log
run_part() {
  local part="$1" cap="$2" rc
  say "part $part (cap ${cap}s)"
  timeout -k 5 "$cap" "$PY" "$REPO/benchmarks/gpu.py" --part "$part" --out "$OUT" $DRYFLAG >"$OUT/$part.log" 2>&1
  rc=$?
  cat "$OUT/$part.log" >>"$LOG"
  if [ $rc = 124 ] || [ $rc = 137 ]; then
    say "part $part stopped at its cap; rows reached: $(cat "$OUT/$part.jsonl" 2>/dev/null | wc -l)"
  elif [ $rc != 0 ]; then
    say "part $part failed (rc $rc), see $LOG"; tail -5 "$OUT/$part.log"; echo "$part" >>"$OUT/failed"
  else
    say "part $part done"
  fi
  rm -f "$OUT/$part.log"
}
# run_lane "NAME:CAP NAME:CAP ...": those parts one after another
run_lane() {
  local entry
  for entry in $1; do run_part "${entry%%:*}" "${entry##*:}"; done
}
rm -f "$OUT/failed"
if [ "$DRY" = 1 ]; then
  # the dry run checks code paths, not times: after env, two lanes side by side (the CPU's
  # cores), each under a minute's worth of parts
  run_lane "${CAPS%% *}"
  run_lane "$DRY_LANE_1" & lane=$!
  run_lane "$DRY_LANE_2"
  wait $lane
else
  run_lane "$CAPS"  # one part at a time: the GPU's timings
fi
STATUS=0
[ -s "$OUT/failed" ] && STATUS=1
rm -f "$OUT/failed"
"$PY" "$REPO/benchmarks/gpu.py" --report --out "$OUT" >>"$LOG" 2>&1 || STATUS=1
rm -rf "$JAXBNP_CACHE_DIR"
say "done in $(( $(date +%s) - START ))s: $OUT/gpu.md"
exit $STATUS
