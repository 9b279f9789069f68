#!/usr/bin/env bash
# netns_selftest.sh — proves netns_hosts.sh: a tiny MPI program on 2 ranks, one in each namespace,
# reports where it runs, and rank 0 sends 1 MiB to rank 1 and checks what comes back. Exits 0,
# 1 on failure, or 77 (ctest's skip) when there is no MPI or namespaces cannot be made.
set -euo pipefail
. "$(dirname "$0")/netns_hosts.sh"
if ! command -v mpicc > /dev/null || ! command -v mpirun > /dev/null; then echo "skipped: no MPI"; exit 77; fi
P=crst$$
TMP=$(mktemp -d /tmp/crew-netns-XXXXXX)
trap 'netns_down "$P"; rm -rf "$TMP"' EXIT
trap 'exit 1' INT TERM HUP               # so that the EXIT trap cleans up there too

cat > "$TMP/pingpong.c" << 'EOF'
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <mpi.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { N = 1 << 20 };

int main(int argc, char **argv) {
  int rank, size, bad = 0;
  char ns[64] = "?", ip[INET_ADDRSTRLEN] = "none";
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  ssize_t len = readlink("/proc/self/ns/net", ns, sizeof ns - 1);
  if (len > 0) ns[len] = '\0';
  struct ifaddrs *ifs, *i;
  if (getifaddrs(&ifs) == 0) {
    for (i = ifs; i; i = i->ifa_next)
      if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET && strcmp(i->ifa_name, "lo") != 0)
        inet_ntop(AF_INET, &((struct sockaddr_in *)i->ifa_addr)->sin_addr, ip, sizeof ip);
    freeifaddrs(ifs);
  }
  printf("rank %d of %d netns %s ip %s\n", rank, size, ns, ip);
  fflush(stdout);
  unsigned char *out = malloc(N), *back = malloc(N);
  if (rank == 0) {
    for (int k = 0; k < N; k++) out[k] = (unsigned char)(k * 131 + k / 4099);
    MPI_Send(out, N, MPI_BYTE, 1, 0, MPI_COMM_WORLD);
    MPI_Recv(back, N, MPI_BYTE, 1, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    bad = memcmp(out, back, N) != 0;
    printf("pingpong %d bytes %s\n", N, bad ? "MISMATCH" : "ok");
  } else if (rank == 1) {
    MPI_Recv(back, N, MPI_BYTE, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    MPI_Send(back, N, MPI_BYTE, 0, 1, MPI_COMM_WORLD);
  }
  free(out);
  free(back);
  MPI_Finalize();
  return bad;
}
EOF
mpicc -O1 -o "$TMP/pingpong" "$TMP/pingpong.c"

netns_up "$P" || { echo "skipped: no network namespaces"; exit 77; }
v=$(netns_veth "$P")
rx() { ip netns exec "${P}b" cat "/sys/class/net/${v}b/statistics/rx_bytes"; }
rx0=$(rx)
status=0
NETNS_MPI_TIMEOUT=60 netns_mpirun "$P" 1 -- "$TMP/pingpong" > "$TMP/out" 2>&1 || status=$?
rx1=$(rx)
cat "$TMP/out"

fail() { echo "FAIL: $*" >&2; exit 1; }
[ "$status" -eq 0 ] || fail "mpirun exited $status"
r0=$(grep '^rank 0 of 2 ' "$TMP/out") || fail "no line from rank 0"
r1=$(grep '^rank 1 of 2 ' "$TMP/out") || fail "no line from rank 1"
grep -qx 'pingpong 1048576 bytes ok' "$TMP/out" || fail "the 1 MiB round trip did not come back intact"
ns_a=$(ip netns exec "${P}a" readlink /proc/self/ns/net)
ns_b=$(ip netns exec "${P}b" readlink /proc/self/ns/net)
[ "$ns_a" != "$ns_b" ] || fail "both namespaces are $ns_a"
[ "$r0" = "rank 0 of 2 netns $ns_a ip $NETNS_ADDR_A" ] || fail "rank 0 is not in ${P}a ($ns_a): $r0"
[ "$r1" = "rank 1 of 2 netns $ns_b ip $NETNS_ADDR_B" ] || fail "rank 1 is not in ${P}b ($ns_b): $r1"
# Both megabytes (and more) crossed the veth, so the ranks really talked TCP between the hosts.
[ $((rx1 - rx0)) -ge $((1 << 20)) ] || fail "only $((rx1 - rx0)) bytes reached ${P}b over the veth"
echo "netns selftest: ok (rank 0 in ${P}a, rank 1 in ${P}b, $((rx1 - rx0)) bytes received by b)"
