#!/usr/bin/env bash
# All-reduce across simulated hosts (scripts/cluster.sh), side by side in one run, for several
# layouts (hosts x ranks per host) and link rates:
#   gz_auto         gz-bench, backend auto = hier(shm inside a host + Gloo across), through gzrun
#   gz_gloo         gz-bench, backend gloo (every rank on Gloo; gz's synchronous-mesh algorithms)
#   gz_gloo_native  the same with GZ_GLOO_SYNC_MAX=0 GZ_GLOO_SEGMENT=0: Gloo's own algorithms
#   mpi             gz-bench, raw MPI_Allreduce (OpenMPI, tcp btl) through mpirun + cluster.sh rsh
#   torch_gloo      PyTorch 1.13 ProcessGroupGloo (bench/gloo_allreduce_bench.py)
# and the TCP floor of the link between host 1 and host 0 (gz-tcp-pingpong: round trip,
# full-duplex exchange, the 2-host all-reduce floor = min(one exchange of S, two exchanges of
# S/2), single-stream bandwidth). f32 sum all-reduce, microseconds per op (slowest rank's mean).
#
#   bench/run_multihost_bench.sh [--rate R]... [--layout HxR]... [BUILD_DIR]
#     --rate none|1gbit|...  link rate per host (tbf both directions); repeat for several
#                            (default: none = unshaped veth)
#     --layout HxR           H hosts x R ranks per host; repeat (default: 2x1 2x2 4x1 4x2)
#   env: SIZES (4K,16K,64K,256K,1M,4M,16M,64M), REPEATS (2: every measurement runs that many
#        times, in turn, and the tables show the best), WARMUP (2 untimed ops per size),
#        CSV (append long rows there: rate,hosts,ppn,impl,size_bytes,time_us),
#        GZ_BENCH_CLUSTER (cluster id, default mb<pid>)
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
rates=()
layouts=()
build=
while [ $# -gt 0 ]; do
  case $1 in
    --rate) rates+=("$2"); shift 2 ;;
    --rate=*) rates+=("${1#*=}"); shift ;;
    --layout) layouts+=("$2"); shift 2 ;;
    --layout=*) layouts+=("${1#*=}"); shift ;;
    -h | --help) sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) build=$1; shift ;;
  esac
done
[ ${#rates[@]} = 0 ] && rates=(none)
[ ${#layouts[@]} = 0 ] && layouts=(2x1 2x2 4x1 4x2)
build=${build:-${GZ_BUILD_DIR:-$root/build}}
gzrun=$build/tools/gzrun/gzrun
bench=$build/tools/gz-bench/gz-bench
pp=$build/tools/gz-bench/gz-tcp-pingpong
cluster=$root/scripts/cluster.sh
py=/usr/bin/python3  # Debian's python3 has torch 1.13; the one on PATH may not
SIZES=${SIZES:-4K,16K,64K,256K,1M,4M,16M,64M}
CSV=${CSV:-}
REPEATS=${REPEATS:-2}
WARMUP=${WARMUP:-2}
for f in "$gzrun" "$bench" "$pp"; do
  [ -x "$f" ] || { echo "missing $f: build first (scripts/build.sh)" >&2; exit 1; }
done
"$cluster" check || exit $?
have_torch=1
"$py" -c 'import torch.distributed' 2>/dev/null || { have_torch=0; echo "note: no torch in $py: no PyTorch column" >&2; }
mpirun=$(command -v mpirun || true)

id=${GZ_BENCH_CLUSTER:-mb$$}
# Several hosts: the rendezvous store is beyond loopback, so every node needs the job's token.
export GZ_RDZV_TOKEN=${GZ_RDZV_TOKEN:-$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')}
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
# best VALUES...: the smallest (words, so empty results drop out; intended splitting below).
best() { printf '%s\n' "$@" | awk 'NF && ($1 < b || b == "") { b = $1 } END { print b }'; }

# tcp_floor OUT: gz-tcp-pingpong between host 1 (client) and host 0 (server).
tcp_floor() {
  local m
  m=$("${C[@]}" ip 0)
  "${C[@]}" run 0 timeout 300 "$pp" server --once >/dev/null &
  local srv=$!
  "${C[@]}" run 1 timeout 300 "$pp" client "$m" --sizes "$SIZES" --seconds 0.3 --stream-mib 256 >"$1" ||
    echo "gz-tcp-pingpong failed" >&2
  wait $srv
}

# gz_run H R OUT_CSV LOG BACKENDS [ENV...]: gz-bench through gzrun on every host.
gz_run() {
  local hosts=$1 ppn=$2 csv=$3 log=$4 backends=$5 i pids=() m
  shift 5
  m=$("${C[@]}" ip 0)
  for ((i = 0; i < hosts; ++i)); do
    "${C[@]}" run $i env "$@" timeout 600 "$gzrun" --nnodes "$hosts" --node-rank $i --master-addr "$m" \
      --master-port 29500 --nproc-per-node "$ppn" -- "$bench" collectives --op allreduce --backend "$backends" \
      --sizes "$min:$max:x4" --warmup "$WARMUP" --csv "$csv" >"$log.$i" 2>&1 &
    pids+=($!)
  done
  for i in "${pids[@]}"; do wait "$i" || echo "gz-bench (gzrun, $backends $*) failed: see below" >&2; done
}

# measure H R OUT: one round of every implementation on the running cluster, files under OUT.
measure() {
  local hosts=$1 ppn=$2 out=$3 m i hostlist="" pids=()
  m=$("${C[@]}" ip 0)
  mkdir -p "$out"
  gz_run "$hosts" "$ppn" "$out/gz.csv" "$out/gz.txt" gloo,auto
  gz_run "$hosts" "$ppn" "$out/native.csv" "$out/native.txt" gloo GZ_GLOO_SYNC_MAX=0 GZ_GLOO_SEGMENT=0
  if [ -n "$mpirun" ]; then
    for ((i = 0; i < hosts; ++i)); do hostlist+="${hostlist:+,}h$i:$ppn"; done
    "${C[@]}" run 0 env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 MASTER_ADDR="$m" \
      MASTER_PORT=29501 timeout 600 "$mpirun" --host "$hostlist" -np $((hosts * ppn)) \
      --mca plm_rsh_agent "$cluster -c $id rsh" --mca oob_tcp_if_include 10.77.0.0/24 \
      --mca btl_tcp_if_include 10.77.0.0/24 --mca btl self,vader,tcp --mca btl_vader_single_copy_mechanism none \
      "$bench" collectives --op allreduce --backend mpi --sizes "$min:$max:x4" --warmup "$WARMUP" \
      --csv "$out/mpi.csv" >"$out/mpi.txt" 2>&1 || echo "gz-bench (mpirun) failed" >&2
  fi
  if [ $have_torch = 1 ]; then
    local h l
    for ((h = 0; h < hosts; ++h)); do
      for ((l = 0; l < ppn; ++l)); do
        "${C[@]}" run $h env RANK=$((h * ppn + l)) WORLD_SIZE=$((hosts * ppn)) MASTER_ADDR="$m" MASTER_PORT=29502 \
          GLOO_SOCKET_IFNAME=eth0 timeout 600 "$py" "$root/bench/gloo_allreduce_bench.py" --sizes "$SIZES" \
          --warmup "$WARMUP" >"$out/torch.$h.$l.txt" 2>&1 &
        pids+=($!)
      done
    done
    for i in "${pids[@]}"; do wait "$i" || echo "torch gloo bench failed" >&2; done
  fi
}

# One table: LAYOUT (HxR) at RATE, from the rounds under DIR; TCP floor columns for 2 x 1 only.
table() {
  local rate=$1 hosts=$2 ppn=$3 d=$4 tcpdir=$5 n=$(($2 * $3))
  local stream="" k s rtt ex fl ga gg gn mp tg gbest
  [ -n "$tcpdir" ] && stream=$(sed -n 's/.*RESULT tcp stream.*MBps=\([0-9.]*\).*/\1/p' "$tcpdir"/tcp*.txt | sort -g | tail -n1)
  echo
  echo "### ${hosts} hosts x ${ppn} rank(s), link ${rate/none/unshaped (veth)}; us per op (best of $REPEATS)"
  [ -n "$stream" ] && echo "TCP single stream host1->host0: ${stream} MB/s"
  echo
  echo "| size | tcp_rtt | floor | gz_auto | gz_gloo | gz_gloo_native | mpi | torch_gloo | gz busbw GB/s | torch/gz | mpi/gz |"
  echo "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
  for k in "${!size_list[@]}"; do
    s=${size_list[$k]}
    rtt="" fl=""
    if [ -n "$tcpdir" ] && [ "$hosts" = 2 ] && [ "$ppn" = 1 ]; then
      rtt=$(best $(for f in "$tcpdir"/tcp*.txt; do value "$f" rtt_us_median "$s"; done))
      fl=$(best $(for f in "$tcpdir"/tcp*.txt; do value "$f" allreduce2_floor_us "$s"; done))
    fi
    ga=$(best $(for f in "$d"/*/gz.csv; do csv_time "$f" "$(awk -F, '$1 ~ /^auto/ { print $1; exit }' "$f")" "$s"; done))
    gg=$(best $(for f in "$d"/*/gz.csv; do csv_time "$f" gloo "$s"; done))
    gn=$(best $(for f in "$d"/*/native.csv; do csv_time "$f" gloo "$s"; done))
    mp=$(best $(for f in "$d"/*/mpi.csv; do csv_time "$f" mpi "$s"; done))
    tg=$(best $(for f in "$d"/*/torch.0.0.txt; do value "$f" time_us "$s"; done))
    gbest=$(best $ga $gg)
    printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n" "${size_names[$k]}" "${rtt:--}" "${fl:--}" \
      "${ga:-n/a}" "${gg:-n/a}" "${gn:-n/a}" "${mp:-n/a}" "${tg:-n/a}" \
      "$(awk -v t="$gbest" -v s="$s" -v n="$n" 'BEGIN { if (t > 0) printf "%.3f", s / t / 1000 * 2 * (n - 1) / n; else print "n/a" }')" \
      "$(awk -v a="$tg" -v b="$gbest" 'BEGIN { if (a > 0 && b > 0) printf "%.2f", a / b; else print "n/a" }')" \
      "$(awk -v a="$mp" -v b="$gbest" 'BEGIN { if (a > 0 && b > 0) printf "%.2f", a / b; else print "n/a" }')"
    if [ -n "$CSV" ]; then
      [ -s "$CSV" ] || echo "rate,hosts,ppn,impl,size_bytes,time_us" >"$CSV"
      for pair in "tcp_rtt:$rtt" "tcp_floor:$fl" "gz_auto:$ga" "gz_gloo:$gg" "gz_gloo_native:$gn" "mpi:$mp" \
        "torch_gloo:$tg"; do
        [ -n "${pair#*:}" ] && echo "$rate,$hosts,$ppn,${pair%%:*},$s,${pair#*:}" >>"$CSV"
      done
      [ -n "$stream" ] && [ "$k" = 0 ] && echo "$rate,$hosts,$ppn,tcp_stream_MBps,0,$stream" >>"$CSV"
    fi
  done
  echo
  echo "gz busbw = size / min(gz_auto, gz_gloo) x 2(n-1)/n, n = $n ranks; torch/gz and mpi/gz: their time over gz's best"
}

status=0
for rate in "${rates[@]}"; do
  echo "## link ${rate/none/unshaped}: load average at start $(cut -d' ' -f1-3 /proc/loadavg) (2 cores), $(date -u +%FT%TZ)"
  tcpdir=
  for layout in "${layouts[@]}"; do
    hosts=${layout%x*} ppn=${layout#*x}
    up=(up "$hosts")
    [ "$rate" != none ] && up+=(--rate "$rate")
    "${C[@]}" "${up[@]}" >/dev/null || exit 1
    d=$work/$rate/$layout
    for ((rep = 1; rep <= REPEATS; ++rep)); do
      if [ -z "$tcpdir" ]; then mkdir -p "$work/$rate/tcp" && tcp_floor "$work/$rate/tcp/tcp$rep.txt"; fi
      measure "$hosts" "$ppn" "$d/$rep"
    done
    tcpdir=$work/$rate/tcp
    "${C[@]}" down >/dev/null
    for f in "$d"/*/*.txt*; do
      # (mpirun's "plm:rsh: Warning: setpgid(...) failed" under cluster.sh rsh is harmless.)
      if grep -v "setpgid" "$f" | grep -q -E "WRONG|failed|Error|Traceback"; then
        echo "---- $f"; tail -n 20 "$f"; status=1
      fi
    done
    table "$rate" "$hosts" "$ppn" "$d" "$tcpdir"
  done
done
exit $status
