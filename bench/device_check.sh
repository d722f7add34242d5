#!/usr/bin/env bash
# The device check of issue #33: step cost by batch (1, 4, 16, 32), verification cost by draft length (1, 2, 4, 8)
# and the perfect draft's ceiling on free text, on dummy weights of Gemma 3 270M's and Gemma 3 1B's configs
# (bench/device_configs), on CUDA, in under 8 minutes; the JSON reports (+ tables) go to $OUT.
#
#   bench/device_check.sh --fetch-wheels     here (network to the package index): fill bench/device_carry/ with
#                                            what the device machine lacks, print its size and the `carry` list
#                                            that fits the 64 MiB a device run may send (the tree counted in)
#   bench/device_check.sh                    on the device machine (repo root; torch + transformers there, no
#                                            network): install only what is carried and missing, then measure
#   bench/device_check.sh --device cpu --tiny   the same steps on a tiny config (4 layers, hidden 64) with the
#                                            demo tokenizer, on the CPU, in about a minute ($OUT or reports/device-check)
#   bench/device_check.sh --vllm             instead: the vLLM path. Gemma 3 1B's config on dummy weights, the
#                                            extraction workload at concurrency 1, 4, 16 and 32, structspec's own
#                                            engine (off, ff+ngram, policy) beside vLLM (vllm:off, vllm:ngram,
#                                            vllm:policy, vllm:structspec, vllm:structspec-policy) on the same GPU, one `bench decode` report per
#                                            concurrency (decode-vllm-c<N>.json), under 8 minutes. vLLM must be
#                                            installed on the machine (its CUDA wheel is far over what a run
#                                            carries); without it the own engine's rows run and the log says so.
#                                            Both engines run the same seeded random weights (written once as a
#                                            folder under /tmp); a random model seldom closes a string, so every
#                                            output runs to max_tokens (valid 0: truncated, each token under the
#                                            grammar) and "= off" (same_as_off) compares the engines' tokens.
#                                            With --device cpu --tiny: the tiny config, concurrency 1 and 4.
#
# bench/device_carry/ (git-ignored) holds two sets, carried apart because both together may not fit:
#   steps/   the wheels the step timings import and the device lacks (gguf: models.loading imports it)
#   engine/  the wheels the engine imports (grammar packages) + Gemma 3's tokenizer (compact JSON, xz): the
#            perfect draft's ceiling runs only when these are carried
# Without engine/ the step timings still run (the report says the perfect draft was not run, and why).
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT" || exit 2
CARRY=bench/device_carry
CONFIGS=bench/device_configs
PY="${PYTHON:-python3}"
LIMIT_BYTES=$((64 * 1024 * 1024))  # what a device run sends at most: the working tree and the carried paths
PER_MODEL_S=220  # two models within the 8 minutes, with room for the install
MODELS="${DEVICE_CHECK_MODELS:-gemma-3-270m gemma-3-1b}"  # folders of bench/device_configs
EXTRA="${DEVICE_CHECK_ARGS:-}"  # more `structspec bench device` options (later ones win), e.g. "--steps 5"
# dist:import — a package (as pip names it) and the module whose import says whether the machine has it
STEP_PACKAGES="gguf:gguf"
ENGINE_PACKAGES="llguidance:llguidance jsonschema_rs:jsonschema_rs outlines_core:outlines_core google-re2:re2
jsonschema:jsonschema jsonschema-specifications:jsonschema_specifications referencing:referencing rpds-py:rpds"

device=cuda
tiny=0
fetch=0
vllm=0
VLLM_S=440  # the vLLM path's whole budget, shared by its concurrency levels
while [ $# -gt 0 ]; do
  case "$1" in
    --fetch-wheels) fetch=1 ;;
    --device) device="$2"; shift ;;
    --tiny) tiny=1 ;;
    --vllm) vllm=1 ;;
    -h|--help) sed -n '2,33p' "$0"; exit 0 ;;
    *) echo "unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done

say() { echo "[device-check] $*"; }

bytes_of() { du -sb "$@" 2>/dev/null | awk '{s += $1} END {print s + 0}'; }

tree_bytes() {  # what a device run sends besides the carried paths: tracked and untracked-not-ignored files
  git ls-files -z --cached --others --exclude-standard | xargs -0 stat -c %s 2>/dev/null | awk '{s += $1} END {print s + 0}'
}

fetch_set() {  # fetch_set FOLDER "dist:import ..." — the wheels of the exact versions installed here, for the
  local folder="$1" packages="$2" spec dist version   # device's Python 3.12 on x86-64
  rm -rf "$folder" && mkdir -p "$folder" || return 1
  for spec in $packages; do
    version=$("$PY" -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "${spec%%:*}") || return 1
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_31_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
      -d "$folder" "${spec%%:*}==$version" 2>&1 | grep -v '^WARNING: Location' || true
    dist="${spec%%:*}"
    ls "$folder/${dist//-/_}"-[0-9]*.whl >/dev/null 2>&1 || { say "no wheel of $dist==$version"; return 1; }
  done
}

fetch_wheels() {
  fetch_set "$CARRY/steps" "$STEP_PACKAGES" || exit 1
  fetch_set "$CARRY/engine" "$ENGINE_PACKAGES" || exit 1
  local tok out="$CARRY/engine/gemma-3-tokenizer"
  tok=$("$PY" -c "from structspec.models.gemma import ensure_tokenizer; print(ensure_tokenizer())") || exit 1
  mkdir -p "$out" && cp "$tok/tokenizer_config.json" "$out/" || exit 1
  say "compressing Gemma 3's tokenizer (33 MB of JSON; a minute or two)"
  "$PY" -c "import json, sys; json.dump(json.load(open(sys.argv[1])), sys.stdout, separators=(',', ':'), ensure_ascii=False)" \
    "$tok/tokenizer.json" | xz -9 -T1 > "$out/tokenizer.json.xz" || exit 1
  local tree steps engine
  tree=$(tree_bytes); steps=$(bytes_of "$CARRY/steps"); engine=$(bytes_of "$CARRY/engine")
  say "sizes (bytes): working tree $tree, steps/ $steps, engine/ $engine, limit $LIMIT_BYTES"
  du -b "$CARRY"/*/* | sort -n
  if [ $((tree + steps + engine)) -le $LIMIT_BYTES ]; then
    say "both sets fit: carry [\"$CARRY\"]"
  elif [ $((tree + steps)) -le $LIMIT_BYTES ]; then
    say "engine/ does not fit ($((tree + steps + engine - LIMIT_BYTES)) bytes over): carry [\"$CARRY/steps\"]" \
        "(step timings; the perfect draft is not run)"
  else
    say "not even steps/ fits: the working tree alone is $tree bytes"
  fi
}

install_carried() {  # installs each carried wheel whose import fails here into /tmp/structspec-site
  local site=/tmp/structspec-site wheels=() spec dist file
  for spec in $STEP_PACKAGES $ENGINE_PACKAGES; do
    dist="${spec%%:*}"
    "$PY" -c "import ${spec##*:}" 2>/dev/null && continue
    file=$(ls "$CARRY"/*/"${dist//-/_}"-[0-9]*.whl 2>/dev/null | head -1)
    if [ -n "$file" ]; then wheels+=("$file"); else say "missing here and not carried: $dist"; fi
  done
  if [ ${#wheels[@]} -gt 0 ]; then
    say "installing ${wheels[*]}"
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" "${wheels[@]}" \
      || return 1
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
  fi
}

engine_available() {
  "$PY" -c "import structspec.bench.decode_bench" 2>/dev/null
}

bench_one() {  # bench_one NAME MODEL TOKENIZER [bench device options...]
  local name="$1" model="$2" tokenizer="$3"
  shift 3
  say "$name: $model on $device"
  timeout "$PER_MODEL_S" "$PY" -m structspec.cli bench device --model "$model" --tokenizer "$tokenizer" \
    --device "$device" --out "$OUT/device-$name.json" "$@"
  local rc=$?
  [ $rc -eq 0 ] || say "$name: exit $rc$([ $rc -eq 124 ] && echo " (over ${PER_MODEL_S} s)")"
  return $rc
}

vllm_summary() {  # vllm_summary REPORT — one line per row: rate, validity, identity, acceptance, or its error
                  # (a row's error fails the check)
  "$PY" - "$1" <<'PY'
import json, sys
report = json.load(open(sys.argv[1]))
failed = 0
for r in report["runs"]:
    if "error" in r:
        print(f"[device-check]   {r['config']:<12} error: {r['error']}")
        failed = 1
        continue
    same = f"same_as_off={r['same_as_off']:.2f}" if "same_as_off" in r else ""  # vLLM's rows: against vllm:off
    acc = " ".join(f"{k} {v:.2f}" for k, v in r["acceptance"].items()) or "-"
    print(f"[device-check]   {r['config']:<12} {r['tokens_per_s']:8.1f} tok/s  p50 {r['latency_ms_p50']:7.1f} ms  "
          f"valid {r['valid_rate']:.2f} stop {r['stop_rate']:.2f}  {same}  acceptance {acc}")
sys.exit(failed)
PY
}

vllm_check() {  # vllm_check TOKENIZER DTYPE — both engines on one config's dummy weights, a report per level
  local tokenizer="$1" dtype="$2" name=gemma-3-1b levels="1 4 16 32" rows="off,ff+ngram,policy" status=0
  local args='{"gpu_memory_utilization": 0.5}'  # the own engine's model shares the GPU
  if [ $tiny -eq 1 ]; then name=tiny; levels="1 4"; fi
  [ "$device" = cpu ] && args='{"enforce_eager": true}'
  if "$PY" -c "import vllm" 2>/dev/null; then
    rows="$rows,vllm:off,vllm:ngram,vllm:policy,vllm:structspec,vllm:structspec-policy"
  else
    say "vLLM is not installed here (pip install -e '.[vllm]'; its wheel is far over a device run's carry): the own engine's rows only"
  fi
  local left share level end=$((SECONDS + VLLM_S))
  left=$(echo "$levels" | wc -w)
  for level in $levels; do
    share=$(((end - SECONDS) / left))  # what the earlier levels left, shared by this one and the rest
    left=$((left - 1))
    say "vllm path: $name, concurrency $level, rows $rows (at most ${share} s)"
    timeout "$share" "$PY" -m structspec.cli bench decode --model "$CONFIGS/$name" --tokenizer "$tokenizer" \
      --load-format dummy --device "$device" --dtype "$dtype" --executor transformers --workload extraction \
      --concurrency "$level" --requests $((level < 4 ? 8 : 2 * level)) --max-tokens 48 --configs "$rows" \
      --max-model-len 2048 --vllm-args "$args" --save-outputs --out "$OUT/decode-vllm-c$level.json"
    local rc=$?
    if [ $rc -eq 0 ]; then
      vllm_summary "$OUT/decode-vllm-c$level.json" || status=1
    else
      say "concurrency $level: exit $rc$([ $rc -eq 124 ] && echo " (over ${share} s)")"; status=1
    fi
  done
  return $status
}

run_check() {
  export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
  install_carried || { say "installing the carried wheels failed"; return 1; }
  local perfect=(--perfect-draft) tokenizer=structspec/models/demo/target status=0
  if ! engine_available; then
    say "the engine's packages are not all here (engine/ not carried?): step timings only, no perfect draft"
    "$PY" -c "import structspec.bench.decode_bench" 2>&1 | tail -1
    perfect=(--no-perfect-draft)
  fi
  if [ $vllm -eq 1 ] && [ $tiny -eq 1 ]; then
    vllm_check "$tokenizer" float32
    return $?
  fi
  if [ $tiny -eq 1 ]; then
    bench_one tiny "$CONFIGS/tiny" "$tokenizer" --dtype float32 --steps 5 --requests 3 --max-tokens 48 "${perfect[@]}"
    return $?
  fi
  local packed="$CARRY/engine/gemma-3-tokenizer"
  if [ "${perfect[0]}" = --perfect-draft ] && [ ! -f "$packed/tokenizer.json.xz" ]; then
    say "Gemma 3's tokenizer is not carried ($packed): step timings only, no perfect draft"
    perfect=(--no-perfect-draft)
  elif [ "${perfect[0]}" = --perfect-draft ]; then  # Gemma 3 270M and 1B share it
    tokenizer=/tmp/structspec-gemma-3-tokenizer
    mkdir -p "$tokenizer" && cp "$packed/tokenizer_config.json" "$tokenizer/" \
      && "$PY" -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'))" \
        "$packed/tokenizer.json.xz" "$tokenizer/tokenizer.json" || return 1
  fi
  local dtype=bfloat16
  [ "$device" = cpu ] && dtype=float32
  if [ $vllm -eq 1 ]; then
    vllm_check "$tokenizer" "$dtype"
    return $?
  fi
  for name in $MODELS; do
    # shellcheck disable=SC2086 - the extra options are words
    bench_one "$name" "$CONFIGS/$name" "$tokenizer" --dtype "$dtype" "${perfect[@]}" $EXTRA || status=1
  done
  return $status
}

if [ $fetch -eq 1 ]; then
  fetch_wheels
  exit $?
fi
OUT="${OUT:-$ROOT/reports/device-check}"
mkdir -p "$OUT" || exit 2
started=$(date +%s)
run_check 2>&1 | tee "$OUT/device-check.log"
status=${PIPESTATUS[0]}
say "done in $(($(date +%s) - started)) s, exit $status; reports in $OUT" | tee -a "$OUT/device-check.log"
exit "$status"
