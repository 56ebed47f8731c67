# Lesson 08: one process runs every stage (parts 1-3); under mpirun each rank runs one stage (parts 4-5), so the
# program links Open MPI and the kit's process group. The autograder runs on 4 ranks: a pipe of 4 stages, and a
# grid of 2 stages x 2 replicas (the single-process tests run on rank 0 only).
NEEDS := mpi
# The checkpoint of a pipeline is lesson 04's file, written and read by its solution (ckpt_capture uses lesson
# 03's ddp_global_metrics): pipe_ckpt.c, given.
USES := 03-ddp 04-checkpoint/ckpt.c
DEFAULT_NP := 1
GRADE_NP := 4
