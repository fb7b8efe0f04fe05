#!/usr/bin/env bash
# The sandbox's costs (issue 45), against the real release binary on its own embedded PostgreSQL,
# with the mock provider: the start-up of a sandboxed `true` (p50/p99 of 50 commands), the copy
# of a ~10,000-file workspace, and 20 tasks running commands at once (the service's RSS and CPU).
#   cargo build --release --bin subagentd && bash benches/sandbox.sh [path/to/subagentd]
set -euo pipefail
BIN="${1:-${CARGO_TARGET_DIR:-target}/release/subagentd}"
work="$(mktemp -d)"
chmod 755 "$work"
port=$((20000 + RANDOM % 20000))
base="http://127.0.0.1:$port"
SUBAGENTD_DATA_DIR="$work/data" SUBAGENTD_LISTEN="127.0.0.1:$port" SUBAGENTD_DEFAULT_MODEL=mock/m \
  SUBAGENTD_BUILTIN_TOOLS_OFF=web_fetch,web_search RUST_LOG=warn "$BIN" serve >"$work/log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$work"' EXIT
for _ in $(seq 1 300); do curl -fs "$base/readyz" >/dev/null 2>&1 && break; sleep 0.2; done

# A workspace of 10,000 files (100 directories of 100, ~1 KiB each).
mkdir -p "$work/tree"
for d in $(seq 1 100); do
  mkdir -p "$work/tree/d$d"
  for f in $(seq 1 100); do head -c 1000 /dev/urandom | base64 >"$work/tree/d$d/f$f.txt"; done
done
tar -C "$work/tree" -czf "$work/tree.tgz" .
curl -fs -X PUT -H 'content-type: application/gzip' --data-binary "@$work/tree.tgz" "$base/workspaces/bench" >/dev/null

calls() { # N COMMAND: a [mock:calls=…] of N run_command calls (each its own, or the loop guard stops them)
  jq -cn --argjson n "$1" --arg c "$2" '[range($n)] | map({tool: "run_command", args: {command: "\($c) # \(.)"}})'
}
events() { # ID: every event of the task, page after page
  local after="" all="[]" page
  while :; do
    page=$(curl -fs "$base/tasks/$1/events${after:+?after=$after}")
    all=$(jq -c --argjson a "$all" '$a + .events' <<<"$page")
    after=$(jq -r '.next_after // empty' <<<"$page")
    [ -z "$after" ] || [ "$(jq '.events | length' <<<"$page")" = 0 ] && break
  done
  echo "$all"
}
pct() { sort -n | awk -v p="$1" '{a[NR]=$1} END {i=int((NR*p+99)/100); if (i<1) i=1; print a[i]}'; }

# 1. 120 sandboxed `true` (3 tasks of 40, one a turn); each command's own time is its event's
#    `command_ms` (bwrap's start, the namespaces, the cgroup, `sh -c true`, the end).
ms="[]"
for _ in 1 2 3; do
  body=$(jq -cn --arg p "bench [mock:calls=$(calls 40 true)]" \
    '{prompt: $p, workspace: {name: "bench"}, max_turns: 50}')
  t=$(curl -fs -H 'content-type: application/json' -d "$body" "$base/tasks?wait=true&timeout=300")
  echo "status=$(jq -r .status <<<"$t")"
  ms=$(events "$(jq -r .id <<<"$t")" | jq -c --argjson m "$ms" '$m + [.[] | select(.kind == "tool_call_finished") | .data.command_ms]')
done
echo "true x $(jq length <<<"$ms"): p50=$(jq '.[]' <<<"$ms" | pct 50) ms p99=$(jq '.[]' <<<"$ms" | pct 99) ms"

# 2. The copy: tasks over the cached tree; the gap between a task's workspace_ready and its first
#    llm_call_finished is the copy of the tree (and the mock's answer, under a millisecond).
body=$(jq -cn --arg p "bench [mock:calls=$(calls 1 true)]" '{prompt: $p, workspace: {name: "bench"}}')
for _ in 1 2 3 4 5; do
  t=$(curl -fs -H 'content-type: application/json' -d "$body" "$base/tasks?wait=true&timeout=300")
  events "$(jq -r .id <<<"$t")" | jq -r '
    def t: sub("(?<s>\\.[0-9]{3})[0-9]*Z$"; "\(.s)Z") | strptime("%Y-%m-%dT%H:%M:%S.%jZ") | mktime;
    ([.[] | select(.kind == "workspace_ready")][0]) as $w
    | ([.[] | select(.kind == "llm_call_finished")][0]) as $l
    | "copy of \($w.data.bytes) bytes (cached tree: \($w.data.cached)): \($w.created_at) -> \($l.created_at)"'
done

# 3. 20 tasks at once, each 5 commands of ~0.3 s of CPU.
rss() { awk '/VmRSS/ {print int($2/1024)}' "/proc/$pid/status"; }
cpu() { awk '{print $14 + $15}' "/proc/$pid/stat"; }
tck=$(getconf CLK_TCK)
before_rss=$(rss); before_cpu=$(cpu); start=$(date +%s.%N)
busy='i=0; while [ $i -lt 100000 ]; do i=$((i+1)); done'
body=$(jq -cn --arg p "bench [mock:calls=$(calls 5 "$busy")]" '{prompt: $p, workspace: {name: "bench"}, max_turns: 10}')
ids=()
for _ in $(seq 1 20); do ids+=("$(curl -fs -H 'content-type: application/json' -d "$body" "$base/tasks" | jq -r .id)"); done
peak=0
while :; do
  r=$(rss); if [ "$r" -gt "$peak" ]; then peak=$r; fi
  open=0
  for i in "${ids[@]}"; do
    case "$(curl -fs "$base/tasks/$i" | jq -r .status)" in queued | running) open=$((open + 1)) ;; esac
  done
  [ "$open" = 0 ] && break
  sleep 0.2
done
end=$(date +%s.%N)
used=$(( $(cpu) - before_cpu ))
awk -v w="$(awk -v a="$start" -v b="$end" 'BEGIN{print b-a}')" -v c="$used" -v t="$tck" -v r0="$before_rss" -v p="$peak" 'BEGIN{printf "20 tasks x 5 commands: wall=%.1f s, service CPU=%.2f s, RSS before=%d MiB peak=%d MiB\n", w, c/t, r0, p}'
curl -fs "$base/metrics" | grep '^subagentd_sandbox_commands_total'
