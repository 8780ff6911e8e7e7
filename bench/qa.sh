#!/usr/bin/env bash
# The answer-quality benchmark (bench/qa/README.md): for each model, start `edgellm serve` on
# it with its own embedded broker on a free loopback port pair, ask every question of
# bench/qa/questions.jsonl through `edgellm ask` (greedy, 64 tokens at most, the question as
# the only user message, no system prompt), score the answers (bench/qa/score.py) and stop the
# daemon. A benchmark, not a test: wrong answers are the result, not a failure.
#
# Usage: bench/qa.sh MODEL.gguf...
# Env:   EDGELLM_BIN   the binary (default target/release/edgellm, built if missing)
#        QA_FILE       the question set (default bench/qa/questions.jsonl)
#        QA_ONLY       id1,id2,...: ask only these questions
#        QA_OUT        a directory: write NAME.json (scores, every answer) and NAME.serve.log
#                      (the daemon's log) per model, NAME the model file's name without .gguf
#        QA_THREADS    the daemon's worker threads (default: its own, every core)
#        QA_START_TIMEOUT  seconds the daemon may take to answer a first request (default 120)
#        QA_MAX_TOKENS most tokens per answer (default 64; more gives a model that works a sum
#                      out step by step room to reach the result, and takes longer)
# Exit:  0 when every model was run (whatever its score); 1 when a daemon did not start or
#        died, or the set could not be read; 2 on bad usage.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
score="$root/bench/qa/score.py"
qa_file=${QA_FILE:-$root/bench/qa/questions.jsonl}
only=${QA_ONLY:-}
out_dir=${QA_OUT:-}
start_timeout=${QA_START_TIMEOUT:-120}
# What every question is asked with: fixed, so that runs compare (QA_MAX_TOKENS aside).
ask_timeout=120
max_tokens=${QA_MAX_TOKENS:-64}
device=qa-bench

log() { echo "qa: $*" >&2; }
now() { date +%s.%N; }
die() { echo "qa: error: $*" >&2; exit 1; }

[ $# -ge 1 ] || { sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
for m in "$@"; do [ -f "$m" ] || die "$m: no such model file"; done
[ -f "$qa_file" ] || die "$qa_file: no such question set"
[ -z "$out_dir" ] || mkdir -p "$out_dir"

if [ -n "${EDGELLM_BIN:-}" ]; then
    bin=$EDGELLM_BIN
    [ -x "$bin" ] || die "EDGELLM_BIN=$bin is not an executable"
else
    bin=$root/target/release/edgellm
    if [ ! -x "$bin" ]; then
        log "building edgellm (cargo build --release)"
        (cd "$root" && cargo build --release --quiet --bin edgellm)
    fi
fi

# Everything the runs write (config, state directories, logs, answers) lives here, so nothing
# touches /etc, /var/lib or the user's ~/.cache, and it all goes on exit.
work=$(mktemp -d "${TMPDIR:-/tmp}/edgellm-qa.XXXXXX")
daemon=""
cleanup() {
    [ -z "$daemon" ] || stop_daemon
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# The question list, checked once (an unknown QA_ONLY id stops here, before any model loads).
python3 "$score" --questions "$qa_file" ${only:+--only "$only"} --list >"$work/list.tsv"
n_questions=$(wc -l <"$work/list.tsv")
[ "$n_questions" -gt 0 ] || die "no questions selected"

# A free port P on 127.0.0.1 with P+1 free too: the embedded broker takes P for MQTT 5 and P+1
# for 3.1.1. Another process could take them before the daemon binds; the start check below
# then fails with the daemon's log, which names the port.
free_port_pair() {
    python3 - <<'PY'
import socket
for _ in range(100):
    with socket.socket() as a:
        a.bind(("127.0.0.1", 0))
        p = a.getsockname()[1]
        if p >= 65534:
            continue
        with socket.socket() as b:
            try:
                b.bind(("127.0.0.1", p + 1))
            except OSError:
                continue
        print(p)
        break
else:
    raise SystemExit("no free port pair on 127.0.0.1")
PY
}

# SIGTERM: the daemon finishes (or after 10 s cancels) the answer in progress and exits 0.
# Bounded: a daemon still there after 30 s is killed, and said so.
stop_daemon() {
    local pid=$daemon i rc=0 how="after SIGTERM"
    daemon=""
    # It may have exited already (a refused start, a crash): then wait reports how.
    kill -TERM "$pid" 2>/dev/null || how="on its own, before it was stopped"
    for ((i = 0; i < 60; i++)); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.5
    done
    if kill -0 "$pid" 2>/dev/null; then
        log "warning: the daemon (pid $pid) did not stop within 30 s of SIGTERM; killing it"
        kill -KILL "$pid" 2>/dev/null || true
    fi
    wait "$pid" 2>/dev/null || rc=$?
    [ "$rc" = 0 ] || log "warning: the daemon exited with status $rc $how"
}

ask() {  # ask TIMEOUT MAX_TOKENS QUESTION: the final message as JSON on stdout
    # timeout(1) on top of ask's own --timeout: a client that hangs anyway cannot stall the run.
    timeout --kill-after=5 $(($1 + 30)) "$bin" ask --broker "127.0.0.1:$port" --device "$device" \
        --temp 0 -n "$2" --json --timeout "$1" -- "$3" </dev/null
}

status=0
for model in "$@"; do
    name=$(basename "$model" .gguf)
    run="$work/$name"
    mkdir -p "$run/state"
    port=$(free_port_pair)
    printf '[mqtt]\nembedded_port = %d\n' "$port" >"$run/edgellm.toml"
    log "$name: starting the daemon (MQTT 5 on 127.0.0.1:$port)"
    t_start=$(now)
    # --config overrides any EDGELLM_CONFIG of the caller; --state-dir keeps sessions, the
    # answer journal and the audit trail in the scratch directory.
    "$bin" serve --config "$run/edgellm.toml" --model "$model" --device "$device" \
        --state-dir "$run/state" ${QA_THREADS:+--threads "$QA_THREADS"} \
        </dev/null >"$run/serve.log" 2>&1 &
    daemon=$!

    # Up when it answers: `ask` waits for the retained "online" status, so a one-token request
    # proves the broker, the daemon's subscription and the engine at once (and warms the
    # engine, so the first question is not charged for it).
    ready=0
    deadline=$((SECONDS + start_timeout))
    while [ $SECONDS -lt $deadline ]; do
        kill -0 "$daemon" 2>/dev/null || break
        if ask 5 1 "Hello" >/dev/null 2>&1; then ready=1; break; fi
        sleep 0.5
    done
    if [ $ready = 0 ]; then
        if kill -0 "$daemon" 2>/dev/null; then
            log "$name: the daemon did not answer within $start_timeout s; its log:"
        else
            log "$name: the daemon exited before it answered; its log:"
        fi
        tail -n 30 "$run/serve.log" >&2
        stop_daemon
        status=1
        continue
    fi
    t_ready=$(now)
    log "$name: ready after $(python3 -c "print(f'{$t_ready - $t_start:.1f}')") s; asking $n_questions questions"

    answers="$run/answers.jsonl"
    : >"$answers"
    i=0
    while IFS=$'\t' read -r -u 3 id question; do
        i=$((i + 1))
        if ! kill -0 "$daemon" 2>/dev/null; then
            log "$name: the daemon died at question $i ($id); its log:"
            tail -n 30 "$run/serve.log" >&2
            status=1
            break
        fi
        t0=$(now)
        rc=0
        ask "$ask_timeout" "$max_tokens" "$question" >"$run/out" 2>"$run/err" || rc=$?
        secs=$(python3 -c "print(f'{$(now) - $t0:.2f}')")
        # A failed ask is recorded as an answerless miss (with its error), not a stop.
        python3 "$score" --record "$id" "$rc" "$run/out" "$run/err" "$secs" >>"$answers"
        log "[$i/$n_questions] $id (${secs} s, exit $rc)"
    done 3<"$work/list.tsv"
    t_done=$(now)
    stop_daemon
    # The log is otherwise dropped with the scratch directory: say what went wrong in it.
    if grep -qE ' (ERROR|WARN) ' "$run/serve.log"; then
        log "$name: the daemon logged warnings or errors (the first 20):"
        grep -E ' (ERROR|WARN) ' "$run/serve.log" | head -n 20 >&2 || true
    fi
    [ -z "$out_dir" ] || cp "$run/serve.log" "$out_dir/$name.serve.log"

    asking=$(python3 -c "print(f'{$t_done - $t_ready:.1f}')")
    python3 "$score" --questions "$qa_file" ${only:+--only "$only"} --answers "$answers" \
        --model "$name" --seconds "$asking" ${out_dir:+--json-out "$out_dir/$name.json"}
    python3 -c "print(f'time: start {$t_ready - $t_start:.1f} s (to the first answer),' \
        f' questions {$t_done - $t_ready:.1f} s ({($t_done - $t_ready) / max($i, 1):.2f} s each)')"
    echo
done
exit $status
