#!/usr/bin/env bash
# Multi-GPU validation on the 2-GPU H200 host, in one call of about 8 minutes:
#   bash benchmarks/multigpu_h200.sh "$OUT"
# Runs benchmarks/multigpu_h200.py (collectives over NVLink and the host path, traced one-GPU steps, DDP steps on
# 1 and 2 GPUs) into $WORK, then leaves three files in $OUT: multigpu_h200.tgz (everything), summary.md (the
# report's tables, computed there) and run.log. NVLink multicast stays off in every process.
# Afterwards, on any machine: python benchmarks/multigpu_h200_report.py <multigpu_h200.tgz> --install
set -u
OUT=${1:?usage: bash benchmarks/multigpu_h200.sh <out dir>}
WORK=${WORK:-/tmp/multigpu_h200}
TIME_S=${TIME_S:-450}
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
rm -rf "$WORK"
mkdir -p "$WORK" "$OUT"
python3 -c 'import torch; print("torch", torch.__version__, "GPUs", torch.cuda.device_count())' 2>&1 | tee "$OUT/run.log"
timeout $((TIME_S + 60)) python3 benchmarks/multigpu_h200.py --out "$WORK" --time-limit-s "$TIME_S" "${@:2}" \
    2>&1 | grep -v -E "FutureWarning|return func\(\*args" | tee -a "$OUT/run.log"
tar czf "$OUT/multigpu_h200.tgz" -C "$WORK" .
timeout 60 python3 benchmarks/multigpu_h200_report.py "$WORK" --summary-only > "$OUT/summary.md" 2>&1
ls -la "$OUT"
