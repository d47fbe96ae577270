#!/usr/bin/env bash
# Dataset v2 on a 2-GPU H200 host, time-boxed and resumable (a re-run continues where the last one stopped):
# the full GPU sweeps on cuda:0 (label h200); cuda:1 runs the timing-method check and the SM-partition
# characterisation (when CHECK=1), then SM-partition sweeps (labels h200-sm<N>), each a share of the time.
#   TOTAL_S=500 CHECK=1 PARTS="64 32 16" bash benchmarks/h200_campaign.sh <log dir>
set -u
LOGS=${1:-reports/campaign}
TOTAL_S=${TOTAL_S:-500}          # wall-clock budget of the whole campaign
CHECK=${CHECK:-1}
PARTS=${PARTS:-"64 32 16"}
PART_PRECISIONS=${PART_PRECISIONS:-"[fp32,bf16]"}
MAIN_DEVICE=${MAIN_DEVICE:-cuda:0}
mkdir -p "$LOGS"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
END=$((SECONDS + TOTAL_S))
left() { echo $((END - SECONDS - ${1:-40})); }   # seconds left, keeping a margin for in-flight tasks

python3 -m pipeline.collect gpu=h200 device="$MAIN_DEVICE" 'precisions=[fp32,bf16,tf32,fp16]' progress=false \
    time_limit_s="$(left 45)" hydra.run.dir=/tmp/hydra-main > "$LOGS/main.log" 2>&1 &
MAIN=$!
if [ "$MAIN_DEVICE" != "cuda" ]; then
  if [ "$CHECK" = 1 ]; then
    CUDA_VISIBLE_DEVICES=1 timeout 150 python3 benchmarks/timing_check.py --n 100 --out "$LOGS" > "$LOGS/check.log" 2>&1
    CUDA_VISIBLE_DEVICES=1 timeout 150 python3 benchmarks/partition_specs.py $PARTS --out "$LOGS/partition_specs.jsonl" \
        > "$LOGS/partitions.log" 2>&1
  fi
  set -- $PARTS
  count=$#
  for p in $PARTS; do
    share=$(( ($(left 45)) / count )); count=$((count - 1))
    [ "$share" -gt 30 ] || break
    python3 -m pipeline.collect gpu="h200-sm$p" device=cuda:1 sm_partition="$p" max_estimated_ms=50 \
        'ops=[conv2d,linear,bmm]' "precisions=$PART_PRECISIONS" progress=false time_limit_s="$share" \
        hydra.run.dir="/tmp/hydra-sm$p" > "$LOGS/sm$p.log" 2>&1
  done
fi
wait $MAIN
for f in "$LOGS"/*.log; do echo "== $f"; grep -v "^\s*$" "$f" | tail -12; done
cat "$LOGS"/timing_check.md "$LOGS"/partition_specs.jsonl 2>/dev/null
