#!/usr/bin/env bash
# Multi-host collectives on a simulated cluster (scripts/cluster.sh): HOSTS hosts with their own
# hostname, /dev/shm and network namespace; RANKS ranks on each, started by the real launcher of
# each host; the worker (multihost_worker) checks node detection and every op x dtype against
# the reference. GZ_NODE_ID is removed from the environment: hosts are told apart by hostname.
#
#   multihost.sh CLUSTER_SH GZRUN WORKER HOSTS RANKS BACKEND
#     BACKEND  auto      gzrun on every host; expects hier(shm+gloo) (shm inside a host)
#              gloo      gzrun on every host; flat gloo across all ranks, no shm
#              mpi       mpirun on host 0 reaching the others through cluster.sh rsh; flat MPI
#              auto-mpi  mpirun as above, backend auto: hier(shm+mpi)
# Exit 77 (skip) where the cluster cannot be built (not root, no iproute2, no namespaces) or,
# for the mpi variants, mpirun is missing.
# MH_STORE=etcd (gzrun variants): the job's store is a 3-member etcd cluster on hosts 0-2
# (--rdzv-backend etcd, plain http, --rdzv-insecure); etcd-tls: the same over https with etcd's
# authentication (user gz, the rendezvous token as its password). Default tcp: gzrun's TcpStore on
# host 0. Either way the output ends with the rendezvous times (bench/run_rdzv_bench.sh).
set -uo pipefail
[ $# = 6 ] || { echo "usage: multihost.sh CLUSTER_SH GZRUN WORKER HOSTS RANKS BACKEND" >&2; exit 2; }
cluster=$1 gzrun=$2 worker=$3 hosts=$4 ranks=$5 backend=$6
for f in "$cluster" "$gzrun" "$worker"; do [ -x "$f" ] || { echo "FAIL: $f is not executable"; exit 1; }; done
"$cluster" check || exit $?
case $backend in
  mpi | auto-mpi)
    mpirun=$(command -v mpirun) || { echo "SKIP: mpirun not found (install openmpi-bin)"; exit 77; } ;;
esac

id=mh$$
C=("$cluster" -c "$id")
logs=$(mktemp -d)
pids=()
store=${MH_STORE:-tcp}
dir=$logs
if [ "$store" != tcp ]; then
  . "$(dirname "$0")/../launcher/etcd_hosts.sh"
  etcd_check
fi
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
  [ "$store" != tcp ] && etcd_kill_all
  "${C[@]}" down
  rm -rf "$logs"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
"${C[@]}" up "$hosts" || exit $?
master=$("${C[@]}" ip 0)
world=$((hosts * ranks))
# Several hosts: the store is beyond loopback, so every rank needs the job's token (cluster.sh
# run and rsh keep the environment, so it reaches gzrun, mpirun and every rank).
export GZ_RDZV_TOKEN=${GZ_RDZV_TOKEN:-$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')}

# What the worker must see.
expect=(GTEST_COLOR=no GZ_TEST_FULL="${GZ_TEST_FULL:-1}" GZ_EXPECT_HOSTS="$hosts" GZ_TIMEOUT_S=30 GZ_LOG_LEVEL="${GZ_LOG_LEVEL:-warn}")
case $backend in
  auto) expect+=(GZ_TEST_BACKEND=auto GZ_EXPECT_BACKEND="hier(shm+gloo)") ;;
  gloo) expect+=(GZ_TEST_BACKEND=gloo GZ_EXPECT_BACKEND=gloo GZ_EXPECT_SHM=0) ;;
  mpi) expect+=(GZ_TEST_BACKEND=mpi GZ_EXPECT_BACKEND=mpi GZ_EXPECT_SHM=0) ;;
  auto-mpi) expect+=(GZ_TEST_BACKEND=auto GZ_EXPECT_BACKEND="hier(shm+mpi)") ;;
  *) echo "FAIL: unknown backend '$backend'"; exit 2 ;;
esac
# Ranks that share a host must share memory; a host with one rank has nothing to share.
case $backend in auto | auto-mpi) [ "$ranks" -gt 1 ] && expect+=(GZ_EXPECT_SHM=1) ;; esac

# The job's store (gzrun variants).
store_args=()
case $store in
  tcp) ;;
  etcd | etcd-tls)
    [ "$hosts" -ge 3 ] || { echo "FAIL: MH_STORE=$store needs 3 hosts for its members"; exit 2; }
    if [ "$store" = etcd-tls ]; then
      etcd_certs
      etcd_up 3 tls
      etcd_wait 30
      etcd_enable_auth "$GZ_RDZV_TOKEN"
      store_args=(--rdzv-conf "user=gz,cacert=$logs/tls/ca.pem")
    else
      etcd_up 3
      etcd_wait 30
      store_args=(--rdzv-insecure)
    fi
    store_args+=(--rdzv-backend etcd --rdzv-endpoints "$ETCD_ENDPOINTS" --rdzv-id "mh$$")
    ;;
  *) echo "FAIL: unknown MH_STORE '$store' (tcp, etcd, etcd-tls)"; exit 2 ;;
esac

start=$(date +%s%N)
status=0
case $backend in
  auto | gloo)
    for ((i = 0; i < hosts; ++i)); do
      "${C[@]}" run "$i" env -u GZ_NODE_ID "${expect[@]}" timeout "${MH_TIMEOUT_S:-50}" "$gzrun" --nnodes "$hosts" --node-rank "$i" \
        --master-addr "$master" --master-port 29500 --nproc-per-node "$ranks" --rdzv-timeout 30 "${store_args[@]}" -- "$worker" \
        >"$logs/host$i.log" 2>&1 &
      pids+=($!)
    done
    for ((i = 0; i < hosts; ++i)); do wait "${pids[$i]}" || { echo "host $i: gzrun exited with $?"; status=1; }; done
    ;;
  mpi | auto-mpi)
    hostlist=
    for ((i = 0; i < hosts; ++i)); do hostlist+=${hostlist:+,}h$i:$ranks; done
    # mpirun runs on host 0; it starts orted on the others through `cluster.sh rsh`, which (unlike
    # ssh) keeps the environment, so the variables below reach every rank.
    "${C[@]}" run 0 env -u GZ_NODE_ID "${expect[@]}" MASTER_ADDR="$master" MASTER_PORT=29500 GZ_NNODES="$hosts" \
      OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
      timeout 50 "$mpirun" --host "$hostlist" -np "$world" --map-by slot \
      --mca plm_rsh_agent "$cluster -c $id rsh" \
      --mca oob_tcp_if_include 10.77.0.0/24 --mca btl_tcp_if_include 10.77.0.0/24 \
      --mca btl self,vader,tcp --mca btl_vader_single_copy_mechanism none \
      "$worker" >"$logs/host0.log" 2>&1 &
    pids+=($!)
    wait "${pids[0]}" || { echo "mpirun exited with $?"; status=1; }
    ;;
esac
pids=()
ms=$((($(date +%s%N) - start) / 1000000))

# The workers' own report: every rank passed, on the expected backend.
passed=$(cat "$logs"/host*.log | sed 's/\x1b\[[0-9;]*m//g' | grep -c '\[  PASSED  \] 1 test')
[ "$passed" = "$world" ] || status=1
if [ $status != 0 ]; then
  for f in "$logs"/host*.log; do
    echo "---- $(basename "$f") (last 40 lines)"
    tail -n 40 "$f"
  done
  echo "FAIL: $hosts hosts x $ranks ranks, backend $backend ($passed of $world ranks passed)"
  exit 1
fi
grep -h -m1 'hosts by rank' "$logs"/host*.log | sed 's/^\[[0-9]*\] //'
grep -h 'backend' "$logs"/host*.log | grep -v GZ_ | sed 's/^\[[0-9]*\] //' | sort | head -n "$world"
# Store round trips per rank for rendezvous + connect (the most any rank made).
trips=$(cat "$logs"/host*.log | sed -n 's/.*store round trips \([0-9]*\).*/\1/p' | sort -n | tail -n 1)
echo "store round trips per rank: max ${trips:-?}"
# Rendezvous time: from launching every host's gzrun until the last rank was through
# gz::rendezvous (the nodes' meeting, worker start, the workers' meeting), and until the last
# rank had its communicator (addresses exchanged through the store, connections made).
all=$(cat "$logs"/host*.log)
last_rdzv=$(echo "$all" | sed -n 's/.*done at wall \([0-9]*\) ns.*/\1/p' | sort -n | tail -n 1)
last_conn=$(echo "$all" | sed -n 's/.*connected at wall \([0-9]*\) ns.*/\1/p' | sort -n | tail -n 1)
slowest=$(echo "$all" | sed -n 's/.*: rendezvous \([0-9]*\) ms,.*/\1/p' | sort -n | tail -n 1)
[ -n "$last_rdzv" ] && echo "rendezvous ($store): every rank through after $(((last_rdzv - start) / 1000000)) ms," \
  "connected after $(((last_conn - start) / 1000000)) ms; slowest rank's rendezvous call ${slowest:-?} ms"
echo "PASS: $hosts hosts x $ranks ranks, backend $backend, every op x dtype matches the reference (${ms} ms)"
