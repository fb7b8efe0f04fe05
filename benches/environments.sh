#!/usr/bin/env bash
# Environments' costs (issue 63), against the real release binary on its own embedded PostgreSQL,
# with the mock provider and Debian's distribution registry on loopback: the first pull of an
# image of about 100 MB and a cached start (`environment_ready.millis`), a named environment whose
# setup writes about 50 MB (PUT to `ready`, then a task's start), and a sandboxed `true` on the
# host's /usr and in an image (`command_ms`, p50/p99 of 40 each), and a small build (a C file
# compiled, linked and run with the host's cc, 10 times), under the runtime
# SUBAGENTD_SANDBOX_RUNTIME names (bwrap, the default, or gvisor).
# Needs docker-registry, umoci, skopeo, busybox-static, jq.
#   cargo build --release --bin subagentd && bash benches/environments.sh [path/to/subagentd]
set -euo pipefail
BIN="${1:-${CARGO_TARGET_DIR:-target}/release/subagentd}"
work="$(mktemp -d)"
chmod 755 "$work"
rport=$((20000 + RANDOM % 20000))
port=$((rport + 1))
base="http://127.0.0.1:$port"
reg="127.0.0.1:$rport"
cat >"$work/registry.yml" <<EOF
version: 0.1
log: {level: error, accesslog: {disabled: true}}
storage: {filesystem: {rootdirectory: $work/registry}}
http: {addr: $reg}
EOF
docker-registry serve "$work/registry.yml" >"$work/registry.log" 2>&1 &
rpid=$!
trap 'kill $rpid ${pid:-} 2>/dev/null; wait 2>/dev/null; rm -rf "$work"' EXIT
for _ in $(seq 1 100); do curl -fs "http://$reg/v2/" >/dev/null 2>&1 && break; sleep 0.1; done

image() { # NAME MB: busybox and MB of random bytes (they do not compress), pushed as bench/NAME:1
  local l="$work/layout-$1" b="$work/bundle-$1"
  umoci init --layout "$l"
  umoci new --image "$l:img"
  umoci unpack --rootless --image "$l:img" "$b" >/dev/null
  mkdir -p "$b/rootfs/bin" "$b/rootfs/data"
  cp "$(command -v busybox)" "$b/rootfs/bin/busybox"
  for t in sh true cat head ls wc; do ln -s busybox "$b/rootfs/bin/$t"; done
  [ "$2" = 0 ] || head -c "$(($2 * 1000000))" /dev/urandom >"$b/rootfs/data/blob"
  umoci repack --image "$l:img" "$b"
  umoci config --image "$l:img" --config.env PATH=/bin
  skopeo copy -q --dest-tls-verify=false "oci:$l:img" "docker://$reg/bench/$1:1"
}
image big 100
image small 0

SUBAGENTD_DATA_DIR="$work/data" SUBAGENTD_LISTEN="127.0.0.1:$port" SUBAGENTD_DEFAULT_MODEL=mock/m \
  SUBAGENTD_BUILTIN_TOOLS_OFF=web_fetch,web_search SUBAGENTD_REGISTRY_ALLOW=127.0.0.1/32 \
  SUBAGENTD_INSECURE_REGISTRIES="$reg" RUST_LOG=warn "$BIN" serve >"$work/log" 2>&1 &
pid=$!
for _ in $(seq 1 300); do curl -fs "$base/readyz" >/dev/null 2>&1 && break; sleep 0.2; done
mkdir -p "$work/tree" && echo hi >"$work/tree/README"
# A small build: one C file (a table of primes and a checksum), compiled, linked and run.
cat >"$work/tree/build.c" <<'EOF_C'
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
static unsigned long sum(const unsigned char *p, size_t n) {
  unsigned long h = 5381;
  while (n--) h = h * 33 + *p++;
  return h;
}
int main(void) {
  enum { N = 100000 };
  unsigned char *sieve = calloc(N, 1);
  int count = 0;
  for (int i = 2; i < N; i++) {
    if (sieve[i]) continue;
    count++;
    for (long j = (long)i * i; j < N; j += i) sieve[j] = 1;
  }
  printf("%d primes, checksum %lu\n", count, sum(sieve, N));
  free(sieve);
  return strcmp("a", "a");
}
EOF_C
tar -C "$work/tree" -czf "$work/tree.tgz" .
curl -fs -X PUT -H 'content-type: application/gzip' --data-binary "@$work/tree.tgz" "$base/workspaces/bench" >/dev/null

calls() { jq -cn --argjson n "$1" --arg c "$2" '[range($n)] | map({tool: "run_command", args: {command: "\($c) # \(.)"}})'; }
run() { # ENV-JSON N COMMAND: a task running N commands in that environment; its events
  local body t
  body=$(jq -cn --arg p "bench [mock:calls=$(calls "$2" "$3")]" --argjson e "$1" \
    '{prompt: $p, workspace: {name: "bench"}, max_turns: 50} + (if $e == null then {} else {environment: $e} end)')
  t=$(curl -fs -H 'content-type: application/json' -d "$body" "$base/tasks?wait=true&timeout=600")
  [ "$(jq -r .status <<<"$t")" = completed ] || { echo "task: $t" >&2; exit 1; }
  curl -fs "$base/tasks/$(jq -r .id <<<"$t")/events?limit=1000" | jq -c .events
}
pct() { sort -n | awk -v p="$1" '{a[NR]=$1} END {i=int((NR*p+99)/100); if (i<1) i=1; print a[i]}'; }
ready() { jq -r '.[] | select(.kind == "environment_ready") | .data | "\(.millis) ms (cached \(.cached), \(.fetched_bytes) bytes fetched, root \(.bytes) bytes)"'; }

big="{\"image\": \"$reg/bench/big:1\"}"
echo "first pull of bench/big (~100 MB): $(run "$big" 1 true | ready)"
echo "cached start of bench/big:         $(run "$big" 1 true | ready)"

t0=$(date +%s%N)
curl -fs -X PUT -H 'content-type: application/json' \
  -d "{\"image\": \"$reg/bench/small:1\", \"setup\": \"mkdir -p /opt && head -c 50000000 /dev/urandom > /opt/blob\"}" \
  "$base/environments/setup50" >/dev/null
while [ "$(curl -fs "$base/environments/setup50" | jq -r .status)" = building ]; do sleep 0.05; done
echo "setup of ~50 MB, PUT to $(curl -fs "$base/environments/setup50" | jq -r .status): $(( ($(date +%s%N) - t0) / 1000000 )) ms"
echo "a task's start in it (cached):     $(run '{"name": "setup50"}' 1 true | ready)"
# The setup's layer is kept for other replicas in the background (packed, written to PostgreSQL):
# the commands below are timed after it.
sleep 5

echo "runtime: ${SUBAGENTD_SANDBOX_RUNTIME:-bwrap}"
for where in host image; do
  e=null
  [ "$where" = image ] && e="$big"
  ms=$(run "$e" 40 true | jq '[.[] | select(.kind == "tool_call_finished") | .data.command_ms] | .[]')
  echo "true on the $where: p50=$(pct 50 <<<"$ms") ms p99=$(pct 99 <<<"$ms") ms"
done
# The small build, on the host's /usr (its C compiler), 10 times.
ms=$(run null 10 "cc -O2 -o /tmp/build build.c && /tmp/build" | jq '[.[] | select(.kind == "tool_call_finished") | .data.command_ms] | .[]')
echo "small build (cc -O2, link, run): p50=$(pct 50 <<<"$ms") ms max=$(pct 100 <<<"$ms") ms"
