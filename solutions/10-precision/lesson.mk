# Lesson 10: lesson 03's MPI program (its loop linked from its solution) in mixed precision and with large
# batches. The autograder runs on 3 ranks: the skip decision and the bf16 all-reduce must agree across them, and
# an odd world is where a ring that rounds its sums twice differs from the right one (test_lesson10.c).
NEEDS := mpi
USES := 03-ddp
DEFAULT_NP := 2
GRADE_NP := 3
