# Sourced by scripts/test (not run): `run CMD [ARGS...]` runs one step in a process group of
# its own and waits for it; SIGINT or SIGTERM to the script stops that whole group (the step,
# and whatever it started: with-postgres, pytest and the sidecars it started, mypy, npm, go),
# waits for it to exit (with-postgres stops its cluster on the way out), then exits 128+signal.
#
# Job control (set -m) is what gives each background step its own process group. A Ctrl-C on a
# terminal reaches only the script (the terminal's foreground group); the trap passes it on.
# A step reads nothing from the terminal (stdin is /dev/null): in a group of its own it could not.

set -m
step_pid=""

# shellcheck disable=SC2329  # invoked by trap
stop_on_signal() { # signal name
    local signal="$1"
    trap '' INT TERM
    if [[ -n "$step_pid" ]]; then
        echo "${0##*/}: SIG$signal: stopping the running step and what it started" >&2
        kill -TERM -- "-$step_pid" 2>/dev/null || true
        wait "$step_pid" 2>/dev/null || true
    fi
    exit $((128 + $(kill -l "$signal")))
}
trap 'stop_on_signal INT' INT
trap 'stop_on_signal TERM' TERM

run() { # CMD [ARGS...]: its exit status is the step's
    "$@" </dev/null &
    step_pid=$!
    local status=0
    # (wait's stderr is job control's "[1]+ Done" notice.)
    wait "$step_pid" 2>/dev/null || status=$?
    step_pid=""
    return "$status"
}
