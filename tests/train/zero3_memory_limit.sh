#!/usr/bin/env bash
# A model too big for one rank's memory trains at ZeRO stage 3 and fails cleanly under DDP.
# 4 ranks of gz-train under gzrun, each in its own cgroup v1 memory cgroup limited to LIMIT_MB: an
# mlp of 25.5 M parameters (102 MB) with AdamW. Under DDP every rank holds the whole parameters,
# gradients and both moments (408 MB): the OOM killer kills a rank, and gzrun must report the
# SIGKILL with its out-of-memory hint. At zero_stage 3 a rank holds a quarter of them, plus one
# unit whole at a time (and the whole parameters for the final evaluation): it completes STEPS
# steps. Prints each rank's peak (memory.max_usage_in_bytes). Checkpoints are off: saving
# consolidates the whole optimizer state on rank 0.
#   zero3_memory_limit.sh GZRUN GZ_TRAIN
# Env: LIMIT_MB (per rank, default 375), STEPS (default 4), STAGE (the sharded run's zero_stage,
# default 3; others for measuring), KEEP_LOGS=DIR.
# Exit 77 (skip) without root or a writable cgroup v1 memory controller.
set -uo pipefail
[ $# -eq 2 ] || { echo "usage: zero3_memory_limit.sh GZRUN GZ_TRAIN" >&2; exit 2; }
gzrun=$1 gztrain=$2
for f in "$gzrun" "$gztrain"; do [ -x "$f" ] || { echo "FAIL: $f is not executable"; exit 1; }; done
[ "$(id -u)" = 0 ] || { echo "SKIP: needs root (cgroup v1 memory limits)"; exit 77; }
mem=/sys/fs/cgroup/memory
[ -w "$mem/cgroup.procs" ] && [ -e "$mem/memory.limit_in_bytes" ] ||
  { echo "SKIP: no writable cgroup v1 memory controller at $mem"; exit 77; }
limit_mb=${LIMIT_MB:-375} steps=${STEPS:-4} stage=${STAGE:-3}

dir=$(mktemp -d)
base=$mem/gz_zero3_mem_$$
cleanup() {
  # Every rank's cgroup, then ours; a worker still inside (it should not be) is killed first.
  for g in "$base"/*/rank* "$base"/*; do
    [ -d "$g" ] || continue
    for p in $(cat "$g/cgroup.procs" 2>/dev/null); do kill -9 "$p" 2>/dev/null; done
    for ((t = 0; t < 50; ++t)); do rmdir "$g" 2>/dev/null && break; sleep 0.1; done
  done
  rmdir "$base" 2>/dev/null
  [ -n "${KEEP_LOGS:-}" ] && mkdir -p "$KEEP_LOGS" && cp "$dir"/*.log "$KEEP_LOGS"/ 2>/dev/null
  rm -rf "$dir"
}
trap cleanup EXIT
mkdir "$base" || { echo "FAIL: cannot create $base"; exit 1; }

# gzrun starts this for every rank: it moves itself into a cgroup of its own, then execs gz-train
# (same pid: gzrun sees gz-train's own end, a SIGKILL included).
cat >"$dir/in_cgroup.sh" <<'EOF'
#!/usr/bin/env bash
g=$GZ_TEST_CGROUP/rank$RANK
# No swapping instead of an OOM kill (a host with swap): swappiness 0, and memory+swap capped too
# where the kernel accounts swap (memory.memsw.*).
mkdir "$g" && echo "$GZ_TEST_LIMIT" >"$g/memory.limit_in_bytes" && echo 0 >"$g/memory.swappiness" &&
  { [ ! -e "$g/memory.memsw.limit_in_bytes" ] || echo "$GZ_TEST_LIMIT" >"$g/memory.memsw.limit_in_bytes"; } &&
  echo $$ >"$g/cgroup.procs" ||
  { echo "in_cgroup.sh: cannot join $g" >&2; exit 99; }
exec "$@"
EOF
chmod +x "$dir/in_cgroup.sh"

# run NAME ZERO_STAGE: 4 ranks, each limited; the exit status of gzrun.
run() {
  mkdir "$base/$1"
  GZ_TEST_CGROUP=$base/$1 GZ_TEST_LIMIT=$((limit_mb << 20)) timeout -k 10 120 "$gzrun" --nproc-per-node 4 \
    --grace-period 2 -- "$dir/in_cgroup.sh" "$gztrain" --dataset synthetic --train_data 512 --test_data 32 \
    --in_channels 1 --input_size 16 --net_type mlp --hidden 1024 --layers 24 --optimizer adamw \
    --batch_size 8 --eval_batch_size 32 --max_steps "$steps" --mode ddp --zero_stage "$2" --num_workers 0 \
    --num_threads 1 --progress false --tensorboard false --save_checkpoints false --log_every 1 \
    --work_dir "$dir/work_$1" >"$dir/$1.log" 2>&1
}
# peaks NAME: every rank's peak in MiB, and how often the OOM killer acted in its cgroup.
peaks() {
  local out="" g
  for g in "$base/$1"/rank*; do
    out+=" ${g##*/}=$(($(cat "$g/memory.max_usage_in_bytes") >> 20))MiB"
    out+="(oom_kill $(awk '$1 == "oom_kill" {print $2}' "$g/memory.oom_control"))"
  done
  echo "$out"
}
fail() { echo "--- $1.log (tail)"; tail -n 25 "$dir/$1.log"; echo "FAIL: $2"; exit 1; }

run zero3 "$stage"
rc3=$?
echo "zero_stage $stage, limit ${limit_mb} MiB per rank: gzrun exit $rc3;$(peaks zero3)"
[ $rc3 = 0 ] || fail zero3 "zero_stage $stage did not complete under ${limit_mb} MiB per rank"
grep -q "steps=$steps .*world=4" "$dir/zero3.log" || fail zero3 "no final line with steps=$steps world=4"

run ddp 0
rcd=$?
echo "DDP, limit ${limit_mb} MiB per rank: gzrun exit $rcd;$(peaks ddp)"
[ $rcd != 0 ] || fail ddp "DDP completed under ${limit_mb} MiB per rank: the model is too small to tell"
grep -q "killed by signal 9 (SIGKILL); gzrun did not send that SIGKILL: possibly killed for lack of memory" \
  "$dir/ddp.log" || fail ddp "gzrun did not report a rank killed by SIGKILL with the out-of-memory hint"
grep -q "oom_kill [1-9]" <<<"$(peaks ddp)" || fail ddp "no rank's cgroup counts an OOM kill"
echo "PASS: zero_stage $stage trains $steps steps in ${limit_mb} MiB per rank, DDP is killed for lack of memory"
