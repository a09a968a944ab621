#!/usr/bin/env bash
# A returning node's snapshot transfer against its link rate (issue 22: "the transfer runs at
# >= 0.5 of the link rate"). Simulated cluster (scripts/cluster.sh) of HOSTS hosts x 1 rank,
# gz-train under gzrun --nnodes 1:HOSTS (elastic) with in-memory snapshots every SNAP_EVERY steps,
# as tests/launcher/multihost_elastic.sh's `snapshot` scenario. Per RATE:
#   round 0  all hosts train (unshaped links) until host 0 holds a snapshot;
#   then     the last host is lost whole (gzrun and worker SIGKILLed, its /dev/shm wiped), its link
#            is shaped to RATE (tbf, both directions: cluster.sh rate), the survivors go on (round 1);
#   link     a plain TCP stream of LINK_S seconds' worth of RATE (at most 256 MB), host 0 -> the
#            last host, python3 sockets, timed on the receiver: the link rate as TCP sees it;
#   round 2  the last host comes back with an empty /dev/shm and gets the snapshot from rank 0 over
#            its shaped link: gz-train's "received the snapshot of step N (X MB) from rank 0 in T s"
#            line (the receiver's broadcast_bytes time) and rank 0's "restored the snapshot ... in
#            T s" (read, broadcast, deserialize, apply). The job is stopped right after.
# One cluster per RATE, taken down on exit. Root only (namespaces, tc).
#
#   flock /work/.bench.lock bench/run_snapshot_transfer.sh [BUILD_DIR]
#   env: RATES ("100mbit 400mbit"), MODEL (bert_small | cnn), HOSTS (2), SNAP_EVERY (5), LINK_S (4),
#        KEEP (a directory for every run's logs)
set -euo pipefail
. "$(dirname "$0")/autogroup.sh"
. "$(dirname "$0")/lib/stats.sh"  # text_lines
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-${GZ_BUILD_DIR:-$root/build}}
RATES=${RATES:-"100mbit 400mbit"}
MODEL=${MODEL:-bert_small}
HOSTS=${HOSTS:-2}
SNAP_EVERY=${SNAP_EVERY:-5}
LINK_S=${LINK_S:-4}
cluster=$root/scripts/cluster.sh
gzrun=$build/tools/gzrun/gzrun
train=$build/apps/gz-train/gz-train
for f in "$gzrun" "$train"; do [ -x "$f" ] || { echo "missing $f: build first" >&2; exit 1; }; done
"$cluster" check || exit $?
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
work=${KEEP:-$(mktemp -d)}
mkdir -p "$work"
id=st$$
C=("$cluster" -c "$id")
last=$((HOSTS - 1))
token=$(openssl rand -hex 32)
echo "runs: $work; build: $build ($(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo '?')); $HOSTS hosts x 1 rank, $MODEL"
echo "start: $(date -u '+%F %T') UTC, load $(cut -d' ' -f1-3 /proc/loadavg)"

stop_all() {  # SIGKILL every gzrun of this script and its workers
  local f p
  for f in "$work"/gzpid_*; do
    [ -f "$f" ] || continue
    p=$(cat "$f")
    for c in $(pgrep -P "$p"); do kill -9 "$c" 2>/dev/null || true; done
    kill -9 "$p" 2>/dev/null || true
    rm -f "$f"
  done
}
cleanup() { stop_all; "${C[@]}" down >/dev/null 2>&1 || true; }
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

case $MODEL in
  bert_small)
    text_lines "$work/text"
    args=(--dataset text_lines --train_data "$work/text" --test_data "$work/text" --net_type bert_small
      --input_size 64 --num_classes 4 --batch_size 8 --eval_batch_size 64 --test_limit 200 --mode ddp
      --num_workers 1 --num_threads 1) ;;
  cnn) args=(--config "$root/configs/fashion_mnist.yaml" --test_limit 2000) ;;
  *) echo "unknown MODEL $MODEL" >&2; exit 2 ;;
esac

start_node() {  # HOST RATE_TAG: gzrun on HOST, pid in gzpid_HOST, output appended to RATE_TAG-hHOST.log
  (
    "${C[@]}" run "$1" env -u GZ_NODE_ID GZ_RDZV_TOKEN="$token" GZ_TIMEOUT_S=60 GZ_LOG_LEVEL=info \
      sh -c 'echo $$ >"$0"; exec "$@"' "$work/gzpid_$1" \
      "$gzrun" --nnodes "1:$HOSTS" --master-addr "$master" --master-port 29500 --nproc-per-node 1 \
      --rdzv-timeout 60 --rdzv-join-window 1 --heartbeat-timeout 3 --grace-period 1 --max-restarts 3 \
      -- "$train" "${args[@]}" --max_steps 100000 --eval_steps 1000000 --save_checkpoints false \
      --resume_from_checkpoint auto --snapshot_every "$SNAP_EVERY" --progress false --log_every 10 --work_dir "$work/$2-work" \
      >>"$work/$2-h$1.log" 2>&1
  ) 2>/dev/null &
  disown $!  # no "Killed" notices: the script kills gzruns on purpose
}
wait_for() {  # SECONDS DESCRIPTION COMMAND...: poll every 0.2 s
  local limit=$(($1 * 5)) what=$2 t
  shift 2
  for ((t = 0; t < limit; ++t)); do "$@" && return 0; sleep 0.2; done
  echo "timed out waiting for: $what (logs: $work)" >&2
  return 1
}
holds_snapshot() { "${C[@]}" run 0 sh -c 'ls /dev/shm/gz-snapshots-*/*/snap-* >/dev/null 2>&1'; }
in_log() { grep -q "$2" "$work/$1.log" 2>/dev/null; }

# link_rate RATE_TAG BYTES -> MB/s of one TCP stream host 0 -> the last host (receiver's clock,
# from the first byte to the last)
link_rate() {
  local port=29600 out=$work/$1-link.txt
  "${C[@]}" run "$last" timeout 120 python3 - "$port" "$2" >"$out" 2>&1 <<'EOF' &
import socket, sys, time
port, want = int(sys.argv[1]), int(sys.argv[2])
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("", port)); s.listen(1)
c, _ = s.accept(); got = 0; buf = bytearray(1 << 20); t0 = None
while got < want:
    n = c.recv_into(buf)
    if n == 0: break
    if t0 is None: t0 = time.perf_counter(); first = n
    got += n
t = time.perf_counter() - t0
print("%d %.4f %.3f" % (got, t, (got - first) / t / 1e6))
EOF
  local rx=$!
  sleep 0.5
  "${C[@]}" run 0 timeout 120 python3 - "$("${C[@]}" ip "$last")" "$port" "$2" <<'EOF'
import socket, sys
host, port, want = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
s = socket.create_connection((host, port)); chunk = b"\0" * (1 << 20); sent = 0
while sent < want: sent += s.send(chunk[: min(len(chunk), want - sent)])
s.shutdown(socket.SHUT_WR); s.recv(1); s.close()
EOF
  wait "$rx"
  awk '{print $3}' "$out"
}

declare -A row
for rate in $RATES; do
  tag=$MODEL-$rate
  "${C[@]}" up "$HOSTS" >/dev/null
  master=$("${C[@]}" ip 0)
  for ((i = 0; i < HOSTS; ++i)); do start_node "$i" "$tag"; done
  wait_for 180 "host 0 to hold a snapshot" holds_snapshot
  victim=$(cat "$work/gzpid_$last")
  kill -9 "$victim" $(pgrep -P "$victim") 2>/dev/null || true
  rm -f "$work/gzpid_$last"
  "${C[@]}" run "$last" sh -c 'rm -rf /dev/shm/gz-snapshots-*'  # the node is gone
  "${C[@]}" rate "$last" "$rate"
  wait_for 120 "round 1" in_log "$tag-h0" 'elastic round 1: node'
  bytes=$(awk -v s="$LINK_S" -v r="$rate" 'BEGIN {
    n = r + 0; m = (r ~ /gbit/) ? 1e9 : (r ~ /mbit/) ? 1e6 : (r ~ /kbit/) ? 1e3 : 1;
    v = n * m / 8 * s; if (v > 256e6) v = 256e6; printf "%d\n", v }')
  link=$(link_rate "$tag" "$bytes")
  start_node "$last" "$tag"
  wait_for 300 "the returning host to receive the snapshot" in_log "$tag-h$last" 'received the snapshot of step' ||
    true
  wait_for 60 "rank 0's restore line" in_log "$tag-h0" 'restored the snapshot of step .* sent by rank' || true
  stop_all
  "${C[@]}" down >/dev/null
  recv=$(grep -ho 'received the snapshot of step .*' "$work/$tag-h$last.log" | tail -n 1)
  restore=$(grep -ho 'restored the snapshot of step [0-9]* ([^)]*) in [0-9.e-]* s' "$work/$tag-h0.log" | tail -n 1 |
    sed 's/.* in \([0-9.e-]*\) s$/\1/')
  mb=$(sed -n 's/.* (\([0-9.e+-]*\) MB) from rank .*/\1/p' <<<"$recv")
  secs=$(sed -n 's/.* in \([0-9.e+-]*\) s: .*/\1/p' <<<"$recv")
  mbs=$(sed -n 's/.* s: \([0-9.e+-]*\) MB\/s.*/\1/p' <<<"$recv")
  echo "rate $rate: link ${link:-?} MB/s; ${recv:-no receive line}; restore ${restore:-?} s; load $(cut -d' ' -f1 /proc/loadavg)"
  row[$rate]=$(awk -v l="${link:-nan}" -v mb="${mb:-nan}" -v s="${secs:-nan}" -v r="${mbs:-nan}" -v rs="${restore:-nan}" \
    -v t="$rate" 'BEGIN { printf "| %s | %.1f | %.1f | %.2f | %.2f | %.1f | %.1f | **%.2f** |", t, l * 8, mb, s, rs, r, r * 8, r / l }')
done
echo
echo "end: $(date -u '+%F %T') UTC, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "| tbf rate | link Mbit/s (TCP, measured) | snapshot MB | transfer s | restore s (rank 0) | transfer MB/s | transfer Mbit/s | transfer / link |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|"
for rate in $RATES; do echo "${row[$rate]}"; done
