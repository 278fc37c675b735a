#!/usr/bin/env bash
# The checks a GPU host runs for local models, in one go: the local-model tests on the card,
# then the local-model and batching benchmarks at Stable Diffusion 1.5's sizes (random
# weights, nothing downloaded). Figures go to $OUT (default: ./gpu-check) as JSON and logs.
#
#   bash scripts/gpu-check.sh            # cuda
#   bash scripts/gpu-check.sh cpu quick  # the same steps on the CPU, tiny pipelines (a dry run)
set -euo pipefail
cd "$(dirname "$0")/.."
DEVICE=${1:-cuda}
QUICK=${2:-}
OUT=${OUT:-gpu-check}
PY=${PYTHON:-.venv/bin/python}
mkdir -p "$OUT"
export PYTHONPATH="src:.${PYTHONPATH:+:$PYTHONPATH}"
if [ "$DEVICE" != cpu ]; then
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
fi
"$PY" -c "import torch, diffusers; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
'diffusers', diffusers.__version__)" | tee "$OUT/versions.txt"

echo "== local-model tests on $DEVICE"
# A failing test does not stop the figures: the log keeps it.
GENHOOK_TEST_DEVICE=$DEVICE "$PY" -m pytest -p no:cacheprovider -q \
    tests/integration/test_local_models.py >"$OUT/tests.log" 2>&1 || echo "TESTS FAILED"
tail -1 "$OUT/tests.log"

if [ -n "$QUICK" ]; then
    size=() tasks=4 steps=2
else
    size=(--real-size) tasks=12 steps=20
fi
for concurrency in 1 2; do
    echo "== local_models.py, concurrency $concurrency"
    "$PY" benchmarks/local_models.py --device "$DEVICE" "${size[@]}" --tasks "$tasks" \
        --steps "$steps" --concurrency "$concurrency" --json "$OUT/local_models_c$concurrency.json"
done
echo "== batching.py, diffusers"
"$PY" benchmarks/batching.py --case diffusers --device "$DEVICE" "${size[@]}" \
    --steps "$steps" --tasks $((tasks + 4)) --rounds 1 --lone 3 --json "$OUT/batching.json"
