# Lesson 06 runs on one device, in one process: no MPI. It reads the checkpoints lesson 04 writes (kit/ckpt.h)
# and image files through libpng (NEEDS := png, found by mk/lessons.mk).
NEEDS := png
