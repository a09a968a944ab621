#!/usr/bin/env bash
# All-reduce across two simulated hosts (scripts/cluster.sh), 1 rank per host, next to the TCP
# floor of the same link: gz-tcp-pingpong (round trip, full-duplex exchange, the 2-host
# all-reduce floor = min(one exchange of S, two exchanges of S/2), single-stream bandwidth),
# gz-bench collectives (gz gloo and auto = hier(shm+gloo), through gzrun on each host; raw MPI
# through mpirun when built with MPI) and PyTorch's ProcessGroupGloo (bench/gloo_allreduce_bench.py),
# all f32 sum all-reduce, for 4 KiB, 64 KiB, 1 MiB and 16 MiB. One table per link rate.
#
#   bench/run_multihost_bench.sh [--rate R]... [BUILD_DIR]
#     --rate none|1gbit|...  link rate per host (tbf both directions); repeat for several tables
#                            (default: none = unshaped veth)
#   env: SIZES (4K,64K,1M,16M), REPEATS (1: every measurement runs that many times, in turn, and
#        the table shows the best, which hides some of a shared machine's noise), CSV (append the
#        rows there too)
# Times are microseconds per all-reduce (slowest rank's mean over ~0.25 s of iterations).
set -uo pipefail
# Small all-reduces on the synchronous Gloo mesh (opt-in since it was measured; see gloo.h).
export GZ_GLOO_SYNC_MAX=${GZ_GLOO_SYNC_MAX:-65536}
root=$(cd "$(dirname "$0")/.." && pwd)
rates=()
build=
while [ $# -gt 0 ]; do
  case $1 in
    --rate) rates+=("$2"); shift 2 ;;
    --rate=*) rates+=("${1#*=}"); shift ;;
    -h | --help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) build=$1; shift ;;
  esac
done
[ ${#rates[@]} = 0 ] && rates=(none)
build=${build:-${GZ_BUILD_DIR:-$root/build}}
gzrun=$build/tools/gzrun/gzrun
bench=$build/tools/gz-bench/gz-bench
pp=$build/tools/gz-bench/gz-tcp-pingpong
cluster=$root/scripts/cluster.sh
py=/usr/bin/python3  # Debian's python3 has torch 1.13; the one on PATH may not
SIZES=${SIZES:-4K,64K,1M,16M}
CSV=${CSV:-}
REPEATS=${REPEATS:-1}
for f in "$gzrun" "$bench" "$pp"; do
  [ -x "$f" ] || { echo "missing $f: build first (scripts/build.sh)" >&2; exit 1; }
done
"$cluster" check || exit $?
have_torch=1
"$py" -c 'import torch.distributed' 2>/dev/null || { have_torch=0; echo "note: no torch in $py: no PyTorch row" >&2; }
mpirun=$(command -v mpirun || true)

id=${GZ_BENCH_CLUSTER:-mb$$}
C=("$cluster" -c "$id")
work=$(mktemp -d)
trap '"${C[@]}" down >/dev/null 2>&1; rm -rf "$work"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 GZ_LOG_LEVEL=warn

bytes_of() {  # 4K -> 4096
  awk -v s="$1" 'BEGIN { u = toupper(substr(s, length(s))); n = s + 0;
    m = (u == "K") ? 1024 : (u == "M") ? 1048576 : (u == "G") ? 1073741824 : 1; printf "%d\n", n * m }'
}
size_list=()
IFS=, read -r -a size_names <<<"$SIZES"
for s in "${size_names[@]}"; do size_list+=("$(bytes_of "$s")"); done
min=${size_list[0]} max=${size_list[-1]}

# value FILE KEY SIZE: KEY=... from the RESULT line of FILE with size=SIZE / size_bytes=SIZE.
value() { sed -n -E "s/.*RESULT .*size(_bytes)?=$3 .*$2=([0-9.]+).*/\2/p" "$1" | head -n1; }
# csv_time FILE BACKEND SIZE: time_us of gz-bench's CSV row.
csv_time() { awk -F, -v b="$2" -v s="$3" '$1 == b && $5 == s { print $6; exit }' "$1" 2>/dev/null; }

# measure OUT: one round of every measurement on the running cluster, files under OUT.
measure() {
  local out=$1 m
  m=$("${C[@]}" ip 0)
  mkdir -p "$out"

  # 1. TCP floor: server on host 0, client on host 1.
  "${C[@]}" run 0 timeout 120 "$pp" server --once >/dev/null &
  local srv=$!
  "${C[@]}" run 1 timeout 120 "$pp" client "$m" --sizes "$SIZES" --seconds 0.3 --stream-mib 256 >"$out/tcp.txt" ||
    echo "gz-tcp-pingpong failed" >&2
  wait $srv

  # 2. gz-bench through gzrun on each host: gz gloo and auto (hier(shm+gloo)).
  local i pids=()
  for i in 0 1; do
    "${C[@]}" run $i timeout 300 "$gzrun" --nnodes 2 --node-rank $i --master-addr "$m" --master-port 29500 \
      --nproc-per-node 1 -- "$bench" collectives --op allreduce --backend gloo,auto --sizes "$min:$max:x16" \
      --csv "$out/gz.csv" >"$out/gz.$i.txt" 2>&1 &
    pids+=($!)
  done
  for i in "${pids[@]}"; do wait "$i" || echo "gz-bench (gzrun) failed: see below" >&2; done

  # 3. raw MPI_Allreduce (OpenMPI, tcp btl between the hosts) through mpirun on host 0.
  if [ -n "$mpirun" ]; then
    "${C[@]}" run 0 env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 MASTER_ADDR="$m" \
      MASTER_PORT=29501 timeout 300 "$mpirun" --host h0:1,h1:1 -np 2 --mca plm_rsh_agent "$cluster -c $id rsh" \
      --mca oob_tcp_if_include 10.77.0.0/24 --mca btl_tcp_if_include 10.77.0.0/24 --mca btl self,tcp \
      "$bench" collectives --op allreduce --backend mpi --sizes "$min:$max:x16" --csv "$out/mpi.csv" \
      >"$out/mpi.txt" 2>&1 || echo "gz-bench (mpirun) failed" >&2
  fi

  # 4. PyTorch ProcessGroupGloo.
  if [ $have_torch = 1 ]; then
    pids=()
    for i in 0 1; do
      "${C[@]}" run $i env RANK=$i WORLD_SIZE=2 MASTER_ADDR="$m" MASTER_PORT=29502 GLOO_SOCKET_IFNAME=eth0 \
        timeout 300 "$py" "$root/bench/gloo_allreduce_bench.py" --sizes "$SIZES" >"$out/torch.$i.txt" 2>&1 &
      pids+=($!)
    done
    for i in "${pids[@]}"; do wait "$i" || echo "torch gloo bench failed" >&2; done
  fi
}

# best VALUES...: the smallest (words, so empty results drop out; intended splitting below).
best() { printf '%s\n' "$@" | awk 'NF && ($1 < b || b == "") { b = $1 } END { print b }'; }

one_rate() {
  local rate=$1 up=(up 2) rep
  [ "$rate" != none ] && up+=(--rate "$rate")
  "${C[@]}" "${up[@]}" >/dev/null || exit 1
  local load
  load=$(cut -d' ' -f1-3 /proc/loadavg)
  for ((rep = 1; rep <= REPEATS; ++rep)); do measure "$work/$rate/$rep"; done
  "${C[@]}" down >/dev/null

  local fails=0 f
  for f in "$work/$rate"/*/*.txt; do
    if grep -q -E "WRONG|failed|Error|Traceback" "$f"; then
      echo "---- $f"; tail -n 20 "$f"; fails=1
    fi
  done

  # The table.
  local stream auto_name
  local d=$work/$rate
  stream=$(sed -n 's/.*RESULT tcp stream.*MBps=\([0-9.]*\).*/\1/p' "$d"/*/tcp.txt | sort -g | tail -n1)
  auto_name=$(cat "$d"/*/gz.csv 2>/dev/null | awk -F, '$1 ~ /^auto/ { print $1; exit }')
  echo
  echo "## 2 hosts x 1 rank, link ${rate/none/unshaped (veth)}; f32 sum all-reduce, us per op (lower is better)"
  echo "## TCP single stream host1->host0: ${stream:-?} MB/s; best of $REPEATS; load average at start: $load (2 cores)"
  printf "| %9s | %9s | %9s | %9s | %9s | %9s | %9s | %10s | %14s |\n" size tcp_rtt tcp_exch floor \
    gz_gloo "gz_auto" mpi torch_gloo "gz_gloo/floor"
  printf "|%s|\n" "-----------|-----------|-----------|-----------|-----------|-----------|-----------|------------|----------------"
  local k s rtt ex fl gg ga mp tg
  for k in "${!size_list[@]}"; do
    s=${size_list[$k]}
    rtt=$(best $(for f in "$d"/*/tcp.txt; do value "$f" rtt_us_median "$s"; done))
    ex=$(best $(for f in "$d"/*/tcp.txt; do value "$f" exchange_us "$s"; done))
    fl=$(best $(for f in "$d"/*/tcp.txt; do value "$f" allreduce2_floor_us "$s"; done))
    gg=$(best $(for f in "$d"/*/gz.csv; do csv_time "$f" gloo "$s"; done))
    ga=$(best $(for f in "$d"/*/gz.csv; do csv_time "$f" "$auto_name" "$s"; done))
    mp=$(best $(for f in "$d"/*/mpi.csv; do csv_time "$f" mpi "$s"; done))
    tg=$(best $(for f in "$d"/*/torch.0.txt; do value "$f" time_us "$s"; done))
    printf "| %9s | %9s | %9s | %9s | %9s | %9s | %9s | %10s | %14s |\n" "${size_names[$k]}" "${rtt:-n/a}" \
      "${ex:-n/a}" "${fl:-n/a}" "${gg:-n/a}" "${ga:-n/a}" "${mp:-n/a}" "${tg:-n/a}" \
      "$(awk -v a="$gg" -v b="$fl" 'BEGIN { if (a > 0 && b > 0) printf "%.2f", a / b; else print "n/a" }')"
    if [ -n "$CSV" ]; then
      [ -s "$CSV" ] || echo "rate,size_bytes,tcp_rtt_us,tcp_exchange_us,floor_us,gz_gloo_us,gz_auto_us,mpi_us,torch_gloo_us,tcp_stream_MBps" >"$CSV"
      echo "$rate,$s,$rtt,$ex,$fl,$gg,$ga,$mp,$tg,$stream" >>"$CSV"
    fi
  done
  echo "## gz_auto = $auto_name; floor = min(exchange(S), 2 x exchange(S/2)) of raw TCP (C, one connection)"
  return $fails
}

status=0
for r in "${rates[@]}"; do one_rate "$r" || status=1; done
exit $status
