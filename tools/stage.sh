#!/usr/bin/env bash
# One stage of `make test`: run it under a hard wall-clock limit, print its wall time, and append
# the time to $STAGE_LOG (`make test` prints the table at the end, slowest stage first).
# Usage: tools/stage.sh NAME LIMIT_SECONDS [VAR=VALUE...] COMMAND [ARGS...]
# At the limit the stage's process group gets SIGTERM, then SIGKILL 30 s later; the stage then fails
# with a line that names it. (Notebook runners also keep a hard limit per notebook of their own.)
# The stage's output is also kept in $STAGE_LOG.d/NAME.log. A stage that fails appends its cause to
# $STAGE_LOG.causes, which `make test` prints at the end: the lines that name what broke (pytest's
# FAILED/ERROR summary lines, the notebook runners' CAUSE lines: notebook, cell, exception), or the
# stage's last lines where it printed none.
set -u -o pipefail
name=$1 limit=$2
shift 2
log_dir="${STAGE_LOG:-.stage-times}.d"
mkdir -p "$log_dir"
log="$log_dir/$name.log"

start=$(date +%s)
timeout --kill-after=30 "$limit" env "$@" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
seconds=$(( $(date +%s) - start ))
if [ "$status" -eq 124 ] || [ "$status" -eq 137 ]; then
  why="ran past its limit of $limit s and was stopped (exit $status)"
  echo "== stage $name $why"
else
  why="exit $status"
  echo "== stage $name: $seconds s (limit $limit s), exit $status"
fi
printf '%s\t%s\t%s\n' "$seconds" "$name" "$status" >> "${STAGE_LOG:-.stage-times}"
if [ "$status" -ne 0 ]; then
  causes=$(sed 's/\x1b\[[0-9;]*m//g' "$log" | grep -E '^(CAUSE |FAILED |ERROR )' | sed 's/^CAUSE //' | head -n 15)
  {
    echo "stage $name: $why (its whole output: $log)"
    if [ -n "$causes" ]; then echo "$causes"; else tail -n 8 "$log"; fi
  } | cut -c1-400 | sed 's/^/   /' >> "${STAGE_LOG:-.stage-times}.causes"
fi
exit "$status"
