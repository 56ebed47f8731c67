# Lesson 04 is lesson 03's DDP program with checkpoints: built with Open MPI, run with several ranks, and
# linked with lesson 03's solution (ddp_* come complete from there).
NEEDS := mpi
USES := 03-ddp
DEFAULT_NP := 2
GRADE_NP := 2
