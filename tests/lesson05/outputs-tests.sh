#!/usr/bin/env bash
# tests/lesson05/outputs-tests.sh: invariant 13 on lesson 05's program, which is lesson 04's run_program_with with
# this lesson's hooks: lesson 04's checks (tests/lesson04/outputs-tests.sh) on this lesson's binary.
#
#   tests/lesson05/outputs-tests.sh TEST_BINARY TRAIN_BINARY [CKPT_COMPARE]
exec "$(dirname "$0")/../lesson04/outputs-tests.sh" "$1" "$2" "${3:-}" 05
