# Lesson 05 is lesson 04's program (DDP with checkpoints) with synchronised batch norm: built with Open MPI,
# run with several ranks, and linked with lesson 03's solution (ddp_*) and lesson 04's (ckpt_*, and the program
# itself: run_program_with, which this lesson's train.c calls with its SyncBN hooks).
NEEDS := mpi
USES := 03-ddp 04-checkpoint
DEFAULT_NP := 2
GRADE_NP := 2
