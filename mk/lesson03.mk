# mk/lesson03.mk: lesson 03's checks beyond the autograder that `make grade-solutions` runs on GRADE_NP ranks:
# the solution's autograder on world sizes 1, 3 and 4, and a rank of the real program killed mid-training.
# Include it after mk/lessons.mk (it uses GRADE_SOLUTIONS_OUT).
#
#   make test-lesson03

LESSON03_TEST := $(GRADE_SOLUTIONS_OUT)/test_lesson03
LESSON03_TRAIN := $(BUILD)/solutions/03-ddp/train

.PHONY: test-lesson03
HELP_TARGETS += test-lesson03
ifneq ($(filter 03-ddp,$(LESSONS_GRADED)),)
TEST_TARGETS += test-lesson03
test-lesson03: $(LESSON03_TEST) $(LESSON03_TRAIN)
	@tests/lesson03/run-tests.sh $(LESSON03_TEST) $(LESSON03_TRAIN)
else
test-lesson03:
	@echo "test-lesson03: skipped: lesson 03 needs Open MPI (install libopenmpi-dev + openmpi-bin: make deps)"
endif
