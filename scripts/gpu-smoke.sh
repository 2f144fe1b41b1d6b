#!/usr/bin/env bash
# GPU smoke check (run on a machine with CUDA; no install needed where torch, psutil and
# requests are present): the example trainer through the three launch forms with NCCL picked
# automatically, warm and cold, and a failing CUDA worker's report.
# Usage: bash scripts/gpu-smoke.sh OUT_DIR
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: gpu-smoke.sh OUT_DIR}
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
status=0
step() { echo "=== $1"; shift; "$@"; rc=$?; echo "=== rc=$rc"; [ $rc = 0 ] || status=1; }
nvidia-smi -L
$py -c "import torch; print('torch', torch.__version__, 'cuda devices', torch.cuda.device_count())"
cfg=examples/configs/tiny.json
step "cli warm (nproc gpu)" $py -m phalanx --standalone --nproc-per-node gpu --log-dir "$out/logs" \
    examples/train.py --config $cfg --output_dir "$out/warm"
step "cli cold" $py -m phalanx --standalone --nproc-per-node 1 --cold-start --log-dir "$out/logs" \
    examples/train.py --config $cfg --output_dir "$out/cold"
step "spawn form" $py examples/train.py --config $cfg --output_dir "$out/spawn" --num_gpus 1
step "same weights warm/cold/spawn" $py - "$out" <<'PY'
import sys, torch
out = sys.argv[1]
w = [torch.load(f"{out}/{k}/final.pt", map_location="cpu") for k in ("warm", "cold", "spawn")]
w = [x.get("model", x) if isinstance(x, dict) else x for x in w]
same = all(torch.equal(w[0][k], other[k]) for other in w[1:] for k in w[0])
print("identical final weights:", same)
sys.exit(0 if same else 1)
PY
cat > "$out/cuda_fail.py" <<'PY'
import torch, torch.distributed as dist
dist.init_process_group("nccl")
x = torch.ones(4, device="cuda")
dist.all_reduce(x)
print("nccl all_reduce", x.tolist(), flush=True)
raise RuntimeError("deliberate failure after a CUDA collective")
PY
echo "=== failing CUDA worker (expect exit 1 and a report naming rank 0 [exception])"
$py -m phalanx --nproc-per-node 1 --log-dir "$out/logs" "$out/cuda_fail.py"; echo "=== rc=$?"
exit $status
