# shellcheck shell=bash
# tests/outputs-lib.sh: what the lessons' output checks (tests/lessonNN/outputs-tests.sh) share, on top of
# tests/extras-lib.sh. They hold DESIGN.md's invariant 13 on the real programs: a run never replaces another
# run's files (checkpoint, folder of checkpoints or of sets, consolidated file, saved parameters), it refuses
# on rank 0 before the first step with the verdict agreed on every rank and names the flag the user passed;
# a run that never recovers ends non-zero. Sourced after extras-lib.sh:
#
#   refused_early WHAT LOG RC PATTERN   ok when the run ended non-zero (RC) with an "error:" line matching PATTERN
#                                   and trained no step (no progress or epoch line in LOG)
#   untouched WHAT FILE SUM         ok when FILE still has the md5 SUM (sum FILE: its md5)
#   sum FILE                        the md5 of FILE (of every file under FILE, for a folder)
export KIT_PROGRESS=plain

sum() {
  if [ -d "$1" ]; then (cd "$1" && find . -type f | sort | xargs md5sum 2>/dev/null) | md5sum | cut -c1-32
  else md5sum <"$1" 2>/dev/null | cut -c1-32; fi
}

refused_early() {
  local what=$1 log=$2 rc=$3 pattern=$4
  if [ "$rc" -eq 0 ]; then bad "$what: ran (exit 0) instead of refusing"; show "$log"; return; fi
  if ! grep -qE "error:.*$pattern" "$log"; then bad "$what: exit $rc without an error matching '$pattern'"; show "$log"; return; fi
  if grep -qE '^epoch [0-9]' "$log"; then bad "$what: refused only after training (an epoch line before the error)"; show "$log"; return; fi
  ok "$what: refused before the first step: $(grep -m1 -oE "error:.*$pattern.*" "$log" | sed "s|$work/||g" | cut -c1-150)"
}

untouched() {
  if [ "$(sum "$2")" = "$3" ]; then ok "$1: untouched"; else bad "$1: CHANGED"; fi
}
