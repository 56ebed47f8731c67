# Lesson 09: an MPI program (lesson 03's loop, linked from its solution) whose ranks each hold a shard of the
# training state. The sharded checkpoint (zero_ckpt.c) writes lesson 04's files (ckpt.c). The autograder runs on
# 3 ranks: an odd world, so that shards are uneven and the padding is exercised.
NEEDS := mpi
USES := 03-ddp 04-checkpoint/ckpt.c
DEFAULT_NP := 2
GRADE_NP := 3
