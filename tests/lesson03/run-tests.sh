#!/usr/bin/env bash
# tests/lesson03/run-tests.sh: lesson 03's checks beyond `make grade-solutions` (which runs the autograder on
# GRADE_NP ranks, one test per process): the whole autograder of the SOLUTION on the other world sizes (more
# ranks than cores run oversubscribed), then the killed-rank test of the real program.
#
#   tests/lesson03/run-tests.sh BUILD/grade-solutions/test_lesson03 BUILD/solutions/03-ddp/train
#
# LESSON03_WORLDS="1 3" chooses the world sizes. Why 1 and 3 are enough (world 4 ran here too: 9 s of this
# script's 28 s at load average 3, 109 s of 177 s at ~20: 4 processes on 2 cores): grade-solutions already runs every
# test on world 2; world 1 is the degenerate case (no peer: one shard is the whole set); world 3 is the first
# world that is odd, above 2 (the bucketed test's world > 2 branch) and oversubscribed on a 2-core machine,
# with uneven shards. The bugs the tests name (a shard that is not positions r, r + world, ...; gradients
# averaged twice, summed, or not reduced; the wrong batch per rank) give a different answer on 3 ranks as on
# 4: the tests compare against the one-process run on the same global batch, whatever the world. Only a rule
# that holds for powers of two alone would pass 3 and fail 4, and no step of the lesson computes one.
set -u
# shellcheck source=SCRIPTDIR/../extras-lib.sh
. "$(dirname "$0")/../extras-lib.sh"
extras_begin 03 "$@"
log=$work/log
# One process per rank runs every test, so the process group of test_setup_process_group (its 7.5 s timeout)
# serves all the later ones; in test_only_rank0_prints rank 0 alone runs the program while the other ranks
# wait at the next collective, longer than 7.5 s on a loaded machine: a limit that no step of the tests nears.
KIT_PG_TIMEOUT=60 solution_on_worlds "$tests" "${LESSON03_WORLDS:-1 3}" 120 '^DDP on'
# The loop's hooks for a lesson's own model and step (given code, not graded: loop_hooks.c).
if timeout --kill-after=5 60 scripts/launch.sh 2 "$tests" --check-loop-hooks >"$log" 2>&1; then
  ok "the loop: $(grep -m1 '^loop hooks' "$log")"
else
  bad "the loop's hooks (open, make_model, step, evaluate, check_replicas)"
  grep -E 'FAIL|error' "$log" | head -n 10 | sed 's/^/   | /'
fi
tests/lesson03/kill-rank.sh "$train" || failed=1
extras_end
