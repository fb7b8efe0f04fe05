#!/usr/bin/env bash
# The sandbox under hostile work (issue 62), against the real release binary on its embedded
# PostgreSQL with the mock provider: tenant `hostile` keeps 20 tasks in flight whose commands are
# fork bombs, memory and disk hogs, a hundred thousand links or directories, and output full of
# NUL and invalid UTF-8; tenant `good` keeps 20 well-behaved tasks in flight beside them. For
# SOAK_SECONDS (600). Every 30 s: the service's RSS and the data directory's size. At the end:
# the good tasks' outcomes (all must complete), the hostile tasks' outcomes, the commands by
# outcome, the peak RSS and the data directory's largest size.
#   cargo build --release --bin subagentd && bash benches/hostile_soak.sh [path/to/subagentd]
set -euo pipefail
BIN="${1:-${CARGO_TARGET_DIR:-target}/release/subagentd}"
SECS="${SOAK_SECONDS:-600}"
work="$(mktemp -d)"
chmod 755 "$work"
port=$((20000 + RANDOM % 20000))
base="http://127.0.0.1:$port"
admin="soak-admin-$RANDOM"
SUBAGENTD_DATA_DIR="$work/data" SUBAGENTD_LISTEN="127.0.0.1:$port" SUBAGENTD_DEFAULT_MODEL=mock/m \
  SUBAGENTD_ADMIN_TOKEN="$admin" SUBAGENTD_BUILTIN_TOOLS_OFF=web_fetch,web_search \
  SUBAGENTD_SANDBOX_MAX_COMMANDS="${SOAK_MAX_COMMANDS:-8}" RUST_LOG=warn "$BIN" serve >"$work/log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$work"' EXIT
for _ in $(seq 1 300); do curl -fs "$base/readyz" >/dev/null 2>&1 && break; sleep 0.2; done

key() { curl -fs -H "authorization: Bearer $admin" -H 'content-type: application/json' \
  -d "{\"tenant\": \"$1\"}" "$base/admin/keys" | jq -r .key; }
HOSTILE=$(key hostile)
GOOD=$(key good)

# A small workspace for each tenant: a few source files.
mkdir -p "$work/tree/src"
for f in $(seq 1 20); do echo "fn f$f() {}" >"$work/tree/src/f$f.rs"; done
tar -C "$work/tree" -czf "$work/tree.tgz" .
for k in "$HOSTILE" "$GOOD"; do
  curl -fs -X PUT -H "authorization: Bearer $k" -H 'content-type: application/gzip' \
    --data-binary "@$work/tree.tgz" "$base/workspaces/soak" >/dev/null
done

hostile_cmds=(
  'b() { b | b & }; b; sleep 20'
  'python3 -c "x = bytearray(6 << 30)"'
  'head -c 2000000000 /dev/urandom > big; ls -l big'
  'python3 -c "import os
for i in range(200000): os.symlink(\"/\" + \"x\" * 200, \"l%d\" % i)"'
  'python3 -c "import os
for i in range(300000): os.mkdir(\"d%d\" % i)"'
  'head -c 2000000 /dev/urandom; printf "a\000b\377c"; cat /proc/1/cmdline'
  'yes | head -c 50000000 | tr y "\000"'
  'while :; do :; done'
)
good_cmds=('echo ok && ls src | wc -l' 'grep -c fn src/*.rs | head -3' 'printf "fn g() {}\n" >> src/f1.rs && cat src/f1.rs')

# A task of 3 commands, one a turn, each its own (the loop guard stops repeats).
body() { # CMD1 CMD2 CMD3
  local calls
  calls=$(jq -cn --arg a "$1" --arg b "$2" --arg c "$3" \
    '[$a, $b, $c] | to_entries | map({tool: "run_command", args: {command: "\(.value) # \(.key)", timeout_seconds: 30}})')
  jq -cn --arg p "soak [mock:calls=$calls]" '{prompt: $p, workspace: {name: "soak"}, max_turns: 6}'
}
submit() { # KEY BODY -> id
  curl -fs -H "authorization: Bearer $1" -H 'content-type: application/json' -d "$2" "$base/tasks" | jq -r .id
}
status() { curl -fs -H "authorization: Bearer $1" "$base/tasks/$2" | jq -r .status; }

declare -A open_h=() open_g=()
declare -A done_h=() done_g=()
n=0
pick() { local -n arr=$1; echo "${arr[$((RANDOM % ${#arr[@]}))]}"; }
fill() {
  while [ "${#open_h[@]}" -lt 20 ]; do
    open_h[$(submit "$HOSTILE" "$(body "$(pick hostile_cmds)" "$(pick hostile_cmds)" 'rm -rf big l* d* 2>/dev/null; echo cleaned')")]=1
  done
  while [ "${#open_g[@]}" -lt 20 ]; do
    open_g[$(submit "$GOOD" "$(body "$(pick good_cmds)" "$(pick good_cmds)" "$(pick good_cmds)")")]=1
  done
}
reap() { # KEY OPEN DONE
  local -n open=$2 dn=$3
  for id in "${!open[@]}"; do
    s=$(status "$1" "$id")
    case "$s" in queued | running | scheduled) ;; *) unset "open[$id]"; dn[$s]=$(( ${dn[$s]:-0} + 1 )) ;; esac
  done
}
rss() { awk '/VmRSS/ {print int($2/1024)}' "/proc/$pid/status"; }
peak_rss=0; peak_du=0
start=$(date +%s); last=0
while [ $(( $(date +%s) - start )) -lt "$SECS" ]; do
  fill
  sleep 2
  reap "$HOSTILE" open_h done_h
  reap "$GOOD" open_g done_g
  el=$(( $(date +%s) - start ))
  if [ $((el - last)) -ge 30 ]; then
    last=$el
    # Files come and go under it while du walks: its complaints are not the figure.
    r=$(rss); d=$( (du -sm "$work/data" 2>/dev/null || true) | tail -1 | cut -f1)
    [ "$r" -gt "$peak_rss" ] && peak_rss=$r
    [ "$d" -gt "$peak_du" ] && peak_du=$d
    echo "t=${el}s rss=${r}MiB data_dir=${d}MiB good_done=$(declare -p done_g | sed 's/declare -A done_g=//') hostile_done=$(declare -p done_h | sed 's/declare -A done_h=//')"
  fi
done
echo "--- after ${SECS}s (tasks still open are not counted)"
echo "good: $(declare -p done_g | sed 's/declare -A done_g=//')"
echo "hostile: $(declare -p done_h | sed 's/declare -A done_h=//')"
echo "peak RSS ${peak_rss} MiB, data directory at most ${peak_du} MiB (sampled every 30 s)"
curl -fs "$base/metrics" | grep -E '^subagentd_sandbox_commands_total|^subagentd_sandbox_slot_wait_seconds_(sum|count)'
grep -c 'worker_lost\|checkpoint' "$work/log" || true
