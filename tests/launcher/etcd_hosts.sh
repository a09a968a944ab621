# An etcd cluster on simulated hosts (scripts/cluster.sh), for tests and benchmarks. Source it
# after setting C=(cluster.sh -c ID) and dir (a scratch directory); then:
#   etcd_check                 exit 77 (skip) when etcd or etcdctl is not installed
#   etcd_certs                 a CA and one member certificate for 10.77.0.1-16 in $dir/tls
#   etcd_up N [tls]            members e0..eN-1 on hosts 0..N-1 (client port 2379, peer 2380, data
#                              on the host's own /dev/shm); sets ETCD_ENDPOINTS (comma list)
#   etcd_wait SECONDS          until every member answers (fails the caller with etcd_fail)
#   etcdctl_on HOST ARGS...    etcdctl on a host against every member (TLS/auth from ETCDCTL_EXTRA)
#   etcd_enable_auth TOKEN     etcd auth on; user gz with password TOKEN may use /gz/
#   etcd_kill I                SIGKILL member I
# Members run with etcd's default timing (heartbeat 100 ms, election 1 s) and --bcrypt-cost 4
# (GZ_ETCD_BCRYPT_COST; etcd itself reads ETCD_* variables): the password is the 256-bit rendezvous token, which a slow hash does not make
# any harder to guess, while etcd's default cost 10 spends ~60 ms of a member's CPU per client
# that logs in. Their pids are in $dir/etcdpid_I, their logs in $dir/etcd_I.log.
ETCD_BIN=${GZ_ETCD_BIN:-$(command -v etcd 2>/dev/null)}
ETCDCTL_BIN=$(command -v etcdctl 2>/dev/null)
ETCD_ENDPOINTS=
ETCD_SCHEME=http
ETCDCTL_EXTRA=()

etcd_check() {
  [ -n "$ETCD_BIN" ] && [ -x "$ETCD_BIN" ] || { echo "SKIP: etcd is not installed (apt-get install etcd-server)"; exit 77; }
  [ -n "$ETCDCTL_BIN" ] || { echo "SKIP: etcdctl is not installed (apt-get install etcd-client)"; exit 77; }
}

etcd_certs() {
  command -v openssl >/dev/null || { echo "SKIP: the openssl command is not installed"; exit 77; }
  local t=$dir/tls san=
  mkdir -p "$t"
  for ((i = 1; i <= 16; ++i)); do san+=${san:+,}IP:10.77.0.$i; done
  (
    cd "$t" || exit 1
    q() { "$@" >/dev/null 2>&1; }
    q openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout ca.key -out ca.pem \
      -days 2 -subj /CN=gz-test-etcd-ca || exit 1
    q openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout member.key -out member.csr \
      -subj /CN=etcd-member || exit 1
    printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth\n' "$san" >member.ext
    q openssl x509 -req -in member.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out member.pem -days 2 \
      -extfile member.ext || exit 1
  ) || { echo "FAIL: could not make the test certificates"; exit 1; }
}

etcd_up() {
  local n=$1 tls=${2:-} initial= i ip
  [ "$tls" = tls ] && ETCD_SCHEME=https
  ETCD_ENDPOINTS=
  for ((i = 0; i < n; ++i)); do
    ip=$("${C[@]}" ip "$i")
    initial+=${initial:+,}e$i=http://$ip:2380
    ETCD_ENDPOINTS+=${ETCD_ENDPOINTS:+,}$ETCD_SCHEME://$ip:2379
  done
  for ((i = 0; i < n; ++i)); do
    ip=$("${C[@]}" ip "$i")
    local extra=()
    [ "$tls" = tls ] && extra=(--cert-file "$dir/tls/member.pem" --key-file "$dir/tls/member.key")
    (
      "${C[@]}" run "$i" sh -c 'echo $$ >"$0"; exec "$@"' "$dir/etcdpid_$i" \
        "$ETCD_BIN" --name "e$i" --data-dir "/dev/shm/gz-etcd-e$i" \
        --listen-client-urls "$ETCD_SCHEME://$ip:2379" --advertise-client-urls "$ETCD_SCHEME://$ip:2379" \
        --listen-peer-urls "http://$ip:2380" --initial-advertise-peer-urls "http://$ip:2380" \
        --initial-cluster "$initial" --initial-cluster-token "gz-$$" --initial-cluster-state new \
        --bcrypt-cost "${GZ_ETCD_BCRYPT_COST:-4}" "${extra[@]}" \
        >"$dir/etcd_$i.log" 2>&1
      true  # keeps this subshell (and its "Killed" notice, to /dev/null) between the member and the caller
    ) 2>/dev/null &  # no "Killed" notices: members are killed on purpose
  done
  [ "$tls" = tls ] && ETCDCTL_EXTRA=(--cacert "$dir/tls/ca.pem")
}

etcdctl_on() {
  local host=$1
  shift
  "${C[@]}" run "$host" env ETCDCTL_API=3 "$ETCDCTL_BIN" --endpoints="$ETCD_ENDPOINTS" "${ETCDCTL_EXTRA[@]}" "$@"
}

etcd_wait() {
  local end=$((SECONDS + $1))
  while [ $SECONDS -lt $end ]; do
    etcdctl_on 0 --command-timeout=1s endpoint health >/dev/null 2>&1 && return 0
    sleep 0.2
  done
  for f in "$dir"/etcd_*.log; do echo "---- $f"; tail -n 20 "$f"; done
  echo "FAIL: the etcd members did not all answer within $1 s"
  exit 1
}

# etcd's authentication on: user root (password root-TOKEN) and user gz (password TOKEN, the
# rendezvous token) with read-write on /gz/; later etcdctl_on calls log in as root.
etcd_enable_auth() {
  local token=$1 c
  for c in "user add root --new-user-password=root-$token" "role add root" "user grant-role root root" \
    "user add gz --new-user-password=$token" "role add gzjob" \
    "role grant-permission gzjob --prefix=true readwrite /gz/" "user grant-role gz gzjob" "auth enable"; do
    # shellcheck disable=SC2086
    etcdctl_on 0 $c >/dev/null || { echo "FAIL: etcdctl $c"; exit 1; }
  done
  ETCDCTL_EXTRA+=(--user "root:root-$token")
}

etcd_kill() { [ -f "$dir/etcdpid_$1" ] && kill -9 "$(cat "$dir/etcdpid_$1")" 2>/dev/null; }

etcd_kill_all() { for f in "$dir"/etcdpid_*; do [ -f "$f" ] && kill -9 "$(cat "$f")" 2>/dev/null; done; }
