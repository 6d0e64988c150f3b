#!/usr/bin/env bash
# Instructions the gateway executes per request, counted by callgrind: a figure that does not
# move with the machine's load, unlike the bench's timings. Runs `benches/load` with one flow
# (one client unless told), the gateway under valgrind; once the gateway is warm it zeroes the counts, lets
# the bench run on, dumps them, and divides by the access lines written in between. The
# gateway's share of each round is a third (the bench alternates direct, nginx and gateway
# slices), so what it does while idle is counted too: compare builds, not absolute figures.
#
#   scripts/instructions-per-call.sh [--flow plain|elicitation] [--seconds N]
#                                    [--gateway-binary PATH] [--top N]
#                                    [--clients N] [--distinct-callers]
#
# With more clients (and distinct callers, each a pool key of its own) it tells whether the
# work per request grows with the number of callers, apart from the machine: under valgrind the
# gateway is the bottleneck at any client count, so compare client counts with each other, in
# the same build.
#
# Needs valgrind (Debian package) and nginx (the bench's middle hop; scripts/test.sh installs
# it). Prints instructions per request and the functions with the most inclusive instructions.
set -euo pipefail
cd "$(dirname "$0")/.."

flow=plain
seconds=60
binary=
top=40
clients=1
distinct=()
while [ $# -gt 0 ]; do
    case "$1" in
        --flow) flow=$2; shift 2 ;;
        --seconds) seconds=$2; shift 2 ;;
        --gateway-binary) binary=$2; shift 2 ;;
        --top) top=$2; shift 2 ;;
        --clients) clients=$2; shift 2 ;;
        --distinct-callers) distinct=(--distinct-callers); shift ;;
        *) echo "unknown argument: $1" >&2; exit 64 ;;
    esac
done
command -v valgrind > /dev/null || { echo "valgrind is not installed (apt-get install valgrind)" >&2; exit 69; }

cargo bench --bench load --no-run --quiet
load=$(ls -t target/release/deps/load-* | grep -v '\.d$' | head -1)
out=$(mktemp -d /tmp/mrtr-callgrind.XXXXXX)
args=(--flow "$flow" --clients "$clients" "${distinct[@]}" --duration "${seconds}s" --warmup 2s
      --gateway-prefix "valgrind --tool=callgrind --callgrind-out-file=$out/cg.%p")
[ -n "$binary" ] && args+=(--gateway-binary "$binary")
"$load" "${args[@]}" > "$out/bench.txt" 2>&1 &
bench=$!

pid=
for _ in $(seq 600); do
    pid=$(pgrep -f "callgrind-out-file=$out.* serve " | head -1 || true)
    [ -n "$pid" ] && break
    sleep 0.5
done
[ -n "$pid" ] || { echo "the gateway did not start; bench output:" >&2; cat "$out/bench.txt" >&2; exit 1; }
# The bench writes the gateway's log beside its configuration: <dir>/gateway.toml, <dir>.log.
config=$(tr '\0' '\n' < "/proc/$pid/cmdline" | grep '/gateway.toml$' | head -1)
log="${config%/gateway.toml}.log"
[ -f "$log" ] || { echo "no gateway log at $log" >&2; exit 1; }
served() { grep -c 'request done' "$log" || true; }
# Warm: past start-up and the bench's warm-up slices, and past every client's first call
# (which opens the caller's pooled legacy session).
warm=$(( clients * 4 > 200 ? clients * 4 : 200 ))
for _ in $(seq 1200); do
    [ "$(served)" -ge "$warm" ] && break
    sleep 0.5
done
callgrind_control -z "$pid" > /dev/null
first=$(served)
sleep $(( seconds * 6 / 10 ))
callgrind_control -d "$pid" > /dev/null
last=$(served)
wait "$bench" || true

dump=$(ls "$out"/cg."$pid".* | head -1)
total=$(awk '/^(summary|totals):/ { print $2; exit }' "$dump")
requests=$(( last - first ))
echo "flow: $flow; clients: $clients ${distinct[*]}; requests counted: $requests; instructions: $total"
echo "instructions per request: $(( total / requests ))"
callgrind_annotate --inclusive=yes "$dump" 2> /dev/null | sed -n "1,$(( top + 25 ))p"
echo "dump: $dump"
