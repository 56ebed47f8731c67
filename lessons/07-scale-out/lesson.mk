# Lesson 07 is lesson 03's DDP program started two ways: by mpirun (one node or several, with a hostfile) and
# without it, from a rendezvous store (torchrun-style environment). Built with Open MPI, linked with lesson
# 03's solution (ddp_* come complete from there) and lesson 04's (the program with checkpoints: run_program, so
# that a job restarted by torchrun or requeued by Slurm resumes where it stopped).
NEEDS := mpi
USES := 03-ddp 04-checkpoint
DEFAULT_NP := 2
# Graded on an odd world: at 2 ranks a ring turning the wrong way still sums right (next and previous are
# the same rank).
GRADE_NP := 3
