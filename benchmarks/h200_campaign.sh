#!/usr/bin/env bash
# Dataset v2 on a 2-GPU H200 host, time-boxed and resumable (a re-run continues where the last one stopped).
# cuda:0: a full-GPU sweep of MAIN0_OPS (label h200). cuda:1, in turn: the timing-method check and the
# SM-partition characterisation (CHECK=1), a full-GPU sweep of MAIN1_OPS (label h200, other ops than cuda:0's,
# so the two never measure the same task), then SM-partition sweeps (labels h200-sm<N>) sharing what is left.
#   TOTAL_S=500 CHECK=1 MAIN0_OPS=linear,bmm MAIN1_OPS=conv2d,lstm PARTS="64 32 16" \
#     bash benchmarks/h200_campaign.sh <log dir>
set -u
LOGS=${1:-reports/campaign}
TOTAL_S=${TOTAL_S:-500}
CHECK=${CHECK:-0}
MAIN0_OPS=${MAIN0_OPS:-linear,bmm}
MAIN1_OPS=${MAIN1_OPS:-}
MAIN1_S=${MAIN1_S:-0}               # seconds for the cuda:1 full-GPU sweep (0: until the end if no PARTS)
PARTS=${PARTS:-}
PRECISIONS=${PRECISIONS:-fp32,bf16,tf32,fp16}
PART_PRECISIONS=${PART_PRECISIONS:-fp32,bf16}
PART_OPS=${PART_OPS:-conv2d,linear,bmm}
CHECK_N=${CHECK_N:-100}
mkdir -p "$LOGS"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
END=$((SECONDS + TOTAL_S))
left() { echo $((END - SECONDS - ${1:-45})); }   # seconds left, keeping a margin for in-flight tasks

sweep() {  # label device ops precisions seconds log [extra overrides...]
  local label=$1 device=$2 ops=$3 precisions=$4 seconds=$5 log=$6; shift 6
  python3 -m pipeline.collect gpu="$label" device="$device" "ops=[$ops]" "precisions=[$precisions]" \
      progress=false time_limit_s="$seconds" hydra.run.dir="/tmp/hydra-$label-$device" "$@" > "$LOGS/$log" 2>&1
}

sweep h200 cuda:0 "$MAIN0_OPS" "$PRECISIONS" "$(left)" main0.log &
MAIN=$!
if [ "$CHECK" = 1 ]; then
  CUDA_VISIBLE_DEVICES=1 timeout 200 python3 benchmarks/timing_check.py --n "$CHECK_N" --out "$LOGS" > "$LOGS/check.log" 2>&1
  [ "${PSPECS:-1}" = 1 ] && CUDA_VISIBLE_DEVICES=1 timeout 150 python3 benchmarks/partition_specs.py ${PARTS:-64 32 16} \
      --out "$LOGS/partition_specs.jsonl" > "$LOGS/partitions.log" 2>&1
fi
if [ -n "$MAIN1_OPS" ]; then
  seconds=$(left); [ -n "$PARTS" ] && [ "$MAIN1_S" -gt 0 ] && [ "$MAIN1_S" -lt "$seconds" ] && seconds=$MAIN1_S
  sweep h200 cuda:1 "$MAIN1_OPS" "$PRECISIONS" "$seconds" main1.log
fi
set -- $PARTS
count=$#
for p in $PARTS; do
  share=$(( $(left) / count )); count=$((count - 1))
  [ "$share" -gt 30 ] || break
  sweep "h200-sm$p" cuda:1 "$PART_OPS" "$PART_PRECISIONS" "$share" "sm$p.log" sm_partition="$p" max_estimated_ms=50
done
wait $MAIN
for f in "$LOGS"/*.log; do echo "== $f"; grep -v "^\s*$" "$f" | grep -v Warning | tail -9; done
cat "$LOGS"/timing_check.md "$LOGS"/partition_specs.jsonl 2>/dev/null
