# Lesson 07 is lesson 03's DDP program started two ways: by mpirun (one node or several, with a hostfile) and
# without it, from a rendezvous store (torchrun-style environment). Built with Open MPI, linked with lesson
# 03's solution (ddp_* come complete from there).
NEEDS := mpi
USES := 03-ddp
DEFAULT_NP := 2
GRADE_NP := 2
