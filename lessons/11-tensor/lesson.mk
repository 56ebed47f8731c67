# Lesson 11: an MPI program (lesson 03's loop, linked from its solution) whose ranks each hold a SLICE of every
# residual block. The autograder runs on 4 ranks: a tensor group of 4, and a grid of 2 (tensor) x 2 (data).
NEEDS := mpi
USES := 03-ddp
DEFAULT_NP := 2
GRADE_NP := 4
