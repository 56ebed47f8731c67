# Lesson 03 is an MPI program: built with Open MPI and the kit's process group, run with several ranks.
NEEDS := mpi
DEFAULT_NP := 2
GRADE_NP := 2
