# The GPU kit's share of its call (sourced by run.sh): run a command with at most SHARE seconds,
# then stop it the way SLURM's time limit does, so that its measurement jobs keep the trials
# they finished (deploybench.partial) and the call goes on to pack them.
#
#   run_with_share SHARE COMMAND [ARG ...]
#
# The command runs in a process group of its own (setsid). When its share is up, or when the
# shell running this gets SIGUSR1 (the share's timer sends it; so may whoever wants the run cut
# now), the whole group gets SIGTERM, and SIGKILL KILL_AFTER_S seconds later if anything is
# left. Returns the command's exit status; CUT is 1 when it was cut, else 0 (also when the
# command had ended by itself, status 0, as the cut came).

KILL_AFTER_S=${KILL_AFTER_S:-15}
CUT=0

_cut_now() {
    CUT=1
    _WOKEN=1
    echo "[kit] cut: the run's share is up; stopping it (SIGTERM to its process group)"
    kill -TERM -- "-$_SHARE_CHILD" 2>/dev/null
    _SHARE_KILLER=$(_after "$KILL_AFTER_S" -KILL "-$_SHARE_CHILD")
}

# a timer of _after: its group, and itself in case it has not made the group yet
_stop() {
    kill -- "-$1" 2>/dev/null
    kill "$1" 2>/dev/null
}

# `kill SIGNAL TARGET` in SECONDS, from a process group of its own (its pid, printed): killing
# that group stops the sleep too, so no timer outlives the run
_after() {
    setsid bash -c 'sleep "$1" && kill "$2" -- "$3" 2>/dev/null' _ "$@" > /dev/null 2>&1 &
    echo $!
}

run_with_share() {
    local share=$1 code
    shift
    CUT=0
    _SHARE_KILLER=
    trap _cut_now USR1
    setsid "$@" &
    _SHARE_CHILD=$!
    local timer
    timer=$(_after "$share" -USR1 $$)
    # `wait` returns early when a trapped signal arrives: wait again for the command's status
    while :; do
        _WOKEN=0
        wait "$_SHARE_CHILD"
        code=$?
        [ "$_WOKEN" = 1 ] || break
    done
    trap : USR1  # a late one (the timer's, as the command ended) must not end this shell
    _stop "$timer"
    [ -z "$_SHARE_KILLER" ] || _stop "$_SHARE_KILLER"
    [ "$code" -ne 0 ] || CUT=0
    return "$code"
}
