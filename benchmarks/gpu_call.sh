#!/usr/bin/env bash
# One time-boxed collection call on a GPU host: optional checks first, then a full-GPU sweep of OPS under the
# registry label of the host's first GPU (GPU=<label> overrides; the collector refuses a label of another GPU),
# then the new dataset files packed for the trip back. A re-run resumes where the last one stopped, provided the
# rows of the last call were unpacked into the working tree first (else it measures their tasks again: `python -m
# pipeline.collect.retire --gpu <label> --op <op> --repeated --to datasets/_checks/<name>` moves the repeats out).
#   TOTAL_S=540 OPS=lstm,linear,bmm LSTM_CHECK=1 bash benchmarks/gpu_call.sh "$OUT"
# LSTM_CHECK=1 runs benchmarks/lstm_timing_check.py first and drops lstm from OPS unless the collector's LSTM
# times follow the host in at most 10 % of its rows (see its docstring; LSTM_MAX_RATIO is its --max-ratio).
# CONV_FIRST_CALL=N runs benchmarks/conv_first_call.py on N configs per precision (fp32, bf16) first: where the
# time of conv2d's autotuning first calls goes. EXTRA holds collector overrides: for conv2d, EXTRA="timeout_s=30"
# stops the few tasks whose autotuning takes minutes (reports/collection_checks.md); EXTRA="timeout_s=30
# screen_ms=100" also turns a task whose untuned call takes over 100 ms into over_budget rows before it autotunes
# (twice the sampler's top time band; at 250 ms, 30 % of the sweep's time went to tasks that then timed out).
# CONV_ALGORITHMS=N runs benchmarks/conv_algorithms.py first on up to N of the dataset's conv2d tasks measured below
# the physical lower bound (and 2 large-kernel controls): which cuDNN algorithm (FFT?) runs them.
# LSTM_GRAPH=N runs benchmarks/lstm_graph_check.py on N host_paced and N ok LSTM tasks of the dataset first: can
# CUDA-graph replay time the host-paced ones?
# BACKWARD_CHECK=N runs benchmarks/backward_check.py on N configs per precision of BACKWARD_OPS (default conv2d)
# first: on the whole GPU and in a 32-SM partition, does the explicit backward take the time autograd's does?
# conv2d autotunes for about 20 s per config, and each pass has 110 s: BACKWARD_CHECK=2 suits conv2d.
# SCREEN_CHECK=N runs benchmarks/screen_check.py on N conv2d configs per precision (fp32, bf16) first: does a task's
# first call still autotune after the collector's screen (screen_ms), how far do two autotuned runs differ, and
# does cudnn_benchmark_limit=3 pick slower algorithms than that? Five passes of up to 100 s: SCREEN_CHECK=4 suits.
# Unless the check passes (first calls still autotuning, times within 10 % at the p90), screen_ms is dropped from
# EXTRA (the sweep then autotunes every task). It passed on torch 2.11 (reports/collection_checks.md).
# WARMUP_CHECK=MS first sweeps WARMUP_OPS (default: OPS) for WARMUP_S seconds (default 90) with timing.warmup_ms=MS
# into datasets/_checks/warmup<MS> and compares those rows with datasets/ (benchmarks/sweep_diff.py): does a shorter
# warm-up than the default 100 ms per phase change the times? Its log's rate says what it saves (conv2d and LSTM
# config-precisions take about 0.6 s, up to 0.2 s of it warm-up).
# DEVICE=cuda runs one worker per visible GPU (default cuda:0); the checks use the first GPU.
# PARTS="64 32 16" adds SM-partition sweeps (labels <label>-sm<N>, green contexts of N SMs, behind the collector's
# timeout watchdog) of PART_OPS (default conv2d; never lstm, which hung there) in PART_PRECISIONS (default
# fp32,bf16), forward only, configs estimated over 50 ms left out; they share the time the full-GPU sweep leaves.
# With PARTS, MAIN_S caps the full-GPU sweep's seconds (0, the default: no full-GPU sweep).
#   TOTAL_S=300 PARTS="64 32 16" EXTRA="timeout_s=30 screen_ms=100" bash benchmarks/gpu_call.sh "$OUT"
# Writes to <out>: collect.log, sm<N>.log, data.tgz (the new files under datasets/), checks/ (the checks' output);
# live.tgz (see LIVE_S) only while the call runs, or where it was cut short.
set -u
# A sweep whose in-flight tasks overrun its time limit is interrupted (SIGINT: it flushes its rows) 15 s before
# the call's end, and killed 5 s later, so the rows it wrote are always packed.
hard_stop() {
  local left=$((END - SECONDS - 15)) rc=0
  [ "$left" -ge 1 ] || left=1
  timeout -s INT -k 5 "$left" "$@" || rc=$?
  case $rc in
    0) ;;
    124|137) echo "stopped at the call's end (exit $rc): the rows flushed so far are kept" ;;
    *) echo "failed (exit $rc)" ;;
  esac
}
without() { echo "$1" | tr ',' '\n' | grep -vx "$2" | paste -sd, -; }   # comma list $1 less the item $2
pack() { find datasets -newer /tmp/gpu_call_stamp -type f | tar czf "$1" -T -; }   # the call's new files into $1
OUT=${1:?usage: gpu_call.sh <out dir>}
TOTAL_S=${TOTAL_S:-540}
OPS=${OPS:-linear,bmm}
PRECISIONS=${PRECISIONS:-fp32,bf16,tf32,fp16}
LSTM_CHECK=${LSTM_CHECK:-0}
LSTM_MAX_RATIO=${LSTM_MAX_RATIO:-1.5}
CONV_FIRST_CALL=${CONV_FIRST_CALL:-0}
CONV_ALGORITHMS=${CONV_ALGORITHMS:-0}
LSTM_GRAPH=${LSTM_GRAPH:-0}
BACKWARD_CHECK=${BACKWARD_CHECK:-0}
BACKWARD_OPS=${BACKWARD_OPS:-conv2d}
SCREEN_CHECK=${SCREEN_CHECK:-0}
WARMUP_CHECK=${WARMUP_CHECK:-0}
WARMUP_OPS=${WARMUP_OPS:-}
WARMUP_S=${WARMUP_S:-90}
EXTRA=${EXTRA:-}
DEVICE=${DEVICE:-cuda:0}
PARTS=${PARTS:-}
PART_OPS=${PART_OPS:-conv2d}
PART_PRECISIONS=${PART_PRECISIONS:-fp32,bf16}
MAIN_S=${MAIN_S:-0}
export PYTHONUNBUFFERED=1
# The first GPU's registry label (a host without a visible GPU gets none; its sweeps then refuse to start).
GPU=${GPU:-$(python3 -c 'import torch; from pipeline.gpus import gpu_label; print(gpu_label(torch.cuda.get_device_name(0)))' \
  2>/dev/null || echo none)}
echo "dataset label: $GPU"
END=$((SECONDS + TOTAL_S))
mkdir -p "$OUT/checks"
touch /tmp/gpu_call_stamp
# Every LIVE_S seconds (default 20; 0: off) the files written so far are packed into <out>/live.tgz (atomically):
# a call cut short before its end (its device time ran out while the machine was starting) still brings back
# the rows its sweep flushed. The sweep flushes rows and its run summary every shard_seconds.
LIVE_S=${LIVE_S:-20}
if [ "$LIVE_S" -gt 0 ]; then
  ( while sleep "$LIVE_S"; do
      pack "$OUT/live.tgz.part" 2>/dev/null && mv "$OUT/live.tgz.part" "$OUT/live.tgz"
    done ) &
  LIVE_PID=$!
fi

if [ "$CONV_FIRST_CALL" -gt 0 ]; then
  timeout 200 python3 benchmarks/conv_first_call.py --n "$CONV_FIRST_CALL" --out "$OUT/checks" \
      > "$OUT/checks/conv_first_call.log" 2>&1 || echo "conv_first_call did not finish" >> "$OUT/checks/conv_first_call.log"
fi

if [ "$CONV_ALGORITHMS" -gt 0 ]; then
  timeout 400 python3 benchmarks/conv_algorithms.py --n "$CONV_ALGORITHMS" --out "$OUT/checks" \
      > "$OUT/checks/conv_algorithms.log" 2>&1 || echo "conv_algorithms did not finish" >> "$OUT/checks/conv_algorithms.log"
fi

if [ "$LSTM_GRAPH" -gt 0 ]; then
  timeout 200 python3 benchmarks/lstm_graph_check.py --n "$LSTM_GRAPH" --out "$OUT/checks" \
      > "$OUT/checks/lstm_graph_check.log" 2>&1 || echo "lstm_graph_check did not finish" >> "$OUT/checks/lstm_graph_check.log"
fi

if [ "$BACKWARD_CHECK" -gt 0 ]; then
  timeout 240 python3 benchmarks/backward_check.py --n "$BACKWARD_CHECK" --sms 32 --ops "$BACKWARD_OPS" \
      --child-timeout 110 --out "$OUT/checks" > "$OUT/checks/backward_check.log" 2>&1 \
      || echo "backward_check did not finish" >> "$OUT/checks/backward_check.log"
fi

if [ "$SCREEN_CHECK" -gt 0 ]; then
  if ! timeout 520 python3 benchmarks/screen_check.py --n "$SCREEN_CHECK" --child-timeout 100 --out "$OUT/checks" \
      > "$OUT/checks/screen_check.log" 2>&1
  then
    EXTRA=$(echo "$EXTRA" | sed -E 's/(^|[[:space:]])[+]{0,2}screen_ms=[^[:space:]]*//g')
    echo "screen_check did not finish or failed: screen_ms dropped (EXTRA=\"$EXTRA\")" | tee -a "$OUT/checks/screen_check.log"
  fi
fi

if [ "$LSTM_CHECK" = 1 ]; then
  if ! timeout 150 python3 benchmarks/lstm_timing_check.py --n 6 --max-ratio "$LSTM_MAX_RATIO" \
      --out "$OUT/checks" > "$OUT/checks/lstm_check.log" 2>&1
  then
    echo "LSTM timing check failed or did not finish: lstm dropped from OPS" | tee -a "$OUT/checks/lstm_check.log"
    OPS=$(without "$OPS" lstm)
  fi
fi

WARMUP_OPS=${WARMUP_OPS:-$OPS}   # after the LSTM check, which may have dropped lstm from OPS
if [ "$WARMUP_CHECK" != 0 ] && [ -n "$WARMUP_OPS" ]; then
  warm_dir="datasets/_checks/warmup$WARMUP_CHECK"
  # shellcheck disable=SC2086
  { python3 -m pipeline.collect gpu="$GPU" out="$warm_dir" device="$DEVICE" "ops=[$WARMUP_OPS]" "precisions=[$PRECISIONS]" \
        progress=false time_limit_s="$WARMUP_S" timing.warmup_ms="$WARMUP_CHECK" hydra.run.dir=/tmp/gpu_call_warmup \
        $EXTRA && python3 benchmarks/sweep_diff.py datasets "$warm_dir" --gpu "$GPU"; } > "$OUT/checks/warmup_check.log" 2>&1 \
      || echo "warmup check did not finish" >> "$OUT/checks/warmup_check.log"
fi

LEFT=$((END - SECONDS - 60))   # in-flight tasks finish after the limit, within 45 s (then hard_stop interrupts)
[ -n "$PARTS" ] && [ "$MAIN_S" -lt "$LEFT" ] && LEFT=$MAIN_S
if [ -n "$OPS" ] && [ "$LEFT" -gt 30 ]; then
  # shellcheck disable=SC2086
  hard_stop python3 -m pipeline.collect gpu="$GPU" device="$DEVICE" "ops=[$OPS]" "precisions=[$PRECISIONS]" \
      progress=false time_limit_s="$LEFT" hydra.run.dir=/tmp/gpu_call $EXTRA > "$OUT/collect.log" 2>&1
fi
if [ "$(without "$PART_OPS" lstm)" != "$PART_OPS" ]; then
  echo "PART_OPS: lstm is not swept in SM partitions (cuDNN LSTMs hung there); dropped" | tee "$OUT/parts.log"
  PART_OPS=$(without "$PART_OPS" lstm)
fi
set -- $PARTS
count=$#
for p in $PARTS; do
  share=$(( (END - SECONDS - 60) / count )); count=$((count - 1))
  [ -n "$PART_OPS" ] && [ "$share" -gt 30 ] || break
  # shellcheck disable=SC2086
  hard_stop python3 -m pipeline.collect gpu="$GPU-sm$p" device="$DEVICE" sm_partition="$p" max_estimated_ms=50 \
      "ops=[$PART_OPS]" "precisions=[$PART_PRECISIONS]" progress=false time_limit_s="$share" \
      hydra.run.dir="/tmp/gpu_call_sm$p" $EXTRA > "$OUT/sm$p.log" 2>&1
done
if [ -n "${LIVE_PID:-}" ]; then pkill -P "$LIVE_PID" 2>/dev/null; kill "$LIVE_PID" 2>/dev/null; wait "$LIVE_PID" 2>/dev/null; fi
rm -f "$OUT/live.tgz" "$OUT/live.tgz.part"
pack "$OUT/data.tgz"
for log in "$OUT"/collect.log "$OUT"/sm*.log; do [ -f "$log" ] && echo "== $log" && tail -4 "$log"; done
exit 0
