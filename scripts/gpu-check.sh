#!/usr/bin/env bash
# The checks a GPU host runs for local models, in one go: the local-model benchmark (the
# service against the pipeline alone) at Stable Diffusion 1.5's sizes (random weights, nothing
# downloaded) with one call at a time and with two, the local-model tests on the card, then
# the batching benchmark. The figures come first: a slow step further on cannot cost them. The
# host, the logs and the figures go to $OUT (default: ./gpu-check), five files. First it
# imports what every step needs and stops (exit status 2) when any import fails.
#
#   bash scripts/gpu-check.sh            # cuda
#   bash scripts/gpu-check.sh cpu quick  # the same steps on the CPU, tiny pipelines (a dry run)
set -euo pipefail
cd "$(dirname "$0")/.."
DEVICE=${1:-cuda}
QUICK=${2:-}
OUT=${OUT:-gpu-check}
if [ -z "${PYTHON:-}" ]; then
    PYTHON=python3
    [ -x .venv/bin/python ] && PYTHON=.venv/bin/python
fi
PY=$PYTHON
mkdir -p "$OUT"
export PYTHONPATH="src:.${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
# One build of the weights for every benchmark (2 GB at the real size: never under $OUT).
WEIGHTS=$(mktemp -d "${TMPDIR:-/tmp}/genhook-gpu-check-XXXXXX")
trap 'rm -rf "$WEIGHTS"' EXIT
if [ "$DEVICE" != cpu ]; then
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/host.txt"
fi
"$PY" -c "import torch, diffusers; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
'diffusers', diffusers.__version__)" | tee -a "$OUT/host.txt"
echo "load: $(cat /proc/loadavg)"

# Every module the steps import, before any of them: a host without one (a library's own
# dependency included) fails here in seconds, naming all that are missing, instead of
# each step failing in turn after building its weights.
"$PY" - <<'CHECK' || exit 2
import importlib, traceback
needed = [
    "benchmarks.local_models", "benchmarks.batching", "genhook.runtime.roles",
    "genhook.api.app", "genhook.tasks.worker", "genhook.engines.local._engine",
    "diffusers", "transformers", "accelerate", "safetensors", "nudenet",
    "tests.conftest", "tests.support.tiny_pipelines", "pytest_asyncio", "pytest_timeout",
]
missing = []
for name in needed:
    try:
        importlib.import_module(name)
    except Exception as exc:
        missing.append(f"{name}: {traceback.format_exception_only(exc)[-1].strip()}")
if missing:
    print("cannot run the checks on this host; these imports fail:", *missing, sep="\n  ")
    raise SystemExit(1)
CHECK

if [ -n "$QUICK" ]; then
    size=() tasks=4 steps=2
else
    size=(--real-size) tasks=8 steps=20
fi
local_models() {  # NAME, then the benchmark's own options
    local name=$1
    shift
    echo "== local_models.py $*"
    timeout 240 "$PY" benchmarks/local_models.py --device "$DEVICE" "${size[@]}" --tasks "$tasks" \
        --steps "$steps" --weights "$WEIGHTS" "$@" \
        >"$OUT/local_models_$name.log" 2>&1 || echo "FAILED (see local_models_$name.log)"
    grep -E "^(service|share|direct|worker_start|model_switch|overhead)" "$OUT/local_models_$name.log" || true
}
local_models c2 --concurrency 2
local_models c1 --concurrency 1

echo "== local-model tests on $DEVICE"
deselect=()
if ! "$PY" -c "import av" 2>/dev/null; then
    # PyAV writes the video model's MP4: without it here, its test cannot run on this host.
    echo "PyAV is not installed: the image-to-video test is left out"
    deselect=(--deselect tests/integration/test_local_models.py::test_image_to_video_end_to_end)
fi
# A failing test does not stop the figures: the log keeps it.
GENHOOK_TEST_DEVICE=$DEVICE timeout 300 "$PY" -m pytest -p no:cacheprovider -q \
    tests/integration/test_local_models.py "${deselect[@]}" >"$OUT/tests.log" 2>&1 \
    || echo "TESTS FAILED"
tail -1 "$OUT/tests.log"

echo "== batching.py, diffusers"
timeout 240 "$PY" benchmarks/batching.py --case diffusers --device "$DEVICE" "${size[@]}" \
    --steps "$steps" --tasks $((tasks + 4)) --rounds 1 --lone 3 --weights "$WEIGHTS" \
    >"$OUT/batching.log" 2>&1 || echo "FAILED (see batching.log)"
tail -8 "$OUT/batching.log"
echo "load: $(cat /proc/loadavg)"
