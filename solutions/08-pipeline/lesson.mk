# Lesson 08 is one process: the stages of the model run one after another on this machine's CPU.
NEEDS :=
DEFAULT_NP := 1
GRADE_NP := 1
