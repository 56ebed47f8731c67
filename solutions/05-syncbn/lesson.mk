# Lesson 05 is lesson 04's program (DDP with checkpoints) with synchronised batch norm: built with Open MPI,
# run with several ranks, and linked with lesson 03's solution (ddp_*) and lesson 04's checkpoint code (ckpt_*;
# its train.c is this lesson's, with the SyncBN conversion added, so only ckpt.c is linked from there).
NEEDS := mpi
USES := 03-ddp 04-checkpoint/ckpt.c
DEFAULT_NP := 2
GRADE_NP := 2
