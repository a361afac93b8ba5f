#!/usr/bin/env bash
# One stage of `make test`: run it under a hard wall-clock limit, print its wall time, and append
# the time to _build/stages.log (`make test` prints the table at the end, slowest stage first).
# Usage: tools/stage.sh NAME LIMIT_SECONDS [VAR=VALUE...] COMMAND [ARGS...]
# At the limit the stage's process group gets SIGTERM, then SIGKILL 30 s later; the stage then fails
# with a line that names it. (Notebook runners also keep a hard limit per notebook of their own.)
set -u
name=$1 limit=$2
shift 2

start=$(date +%s)
timeout --kill-after=30 "$limit" env "$@"
status=$?
seconds=$(( $(date +%s) - start ))
if [ "$status" -eq 124 ] || [ "$status" -eq 137 ]; then
  echo "== stage $name ran past its limit of $limit s and was stopped (exit $status)"
else
  echo "== stage $name: $seconds s (limit $limit s), exit $status"
fi
printf '%s\t%s\t%s\n' "$seconds" "$name" "$status" >> "${STAGE_LOG:-.stage-times}"
exit "$status"
