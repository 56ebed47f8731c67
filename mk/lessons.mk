# mk/lessons.mk: the lessons. Its first part is lesson 06's libpng probe and demo (it must come before the
# lesson rules: they decide from NEEDS_HAVE_* which lessons can be built); the second, every lesson's rules.

# ======================================================================== inference

# Lesson 06 (inference from a checkpoint). The lesson says NEEDS := png, and the rules below decide which
# lessons can be built from the NEEDS_HAVE_* set here.
#
#   make lesson-06 [ARGS=...]  without --checkpoint in ARGS: trains a short lesson 04 run first (synthetic,
#                              tiny-bn, 2 epochs, 2 ranks) into results/lesson06-demo.ckpt, once, and evaluates it
#   make bench-inference       the kit against PyTorch on the same weights: latency (batch 1) and throughput
#                              (batch 256), one run, load average recorded -> bench/results-inference.md

# ---- libpng (image files)
PNG_CFLAGS := $(shell pkg-config --cflags libpng 2>/dev/null)
PNG_LIBS := $(or $(shell pkg-config --libs libpng 2>/dev/null),-lpng)
HAVE_PNG := $(call try_link,#include <png.h>,png_image i; png_image_free(&i),$(PNG_CFLAGS) $(PNG_LIBS))
NEEDS_CPPFLAGS_png = $(PNG_CFLAGS)
NEEDS_LIBS_png = $(PNG_LIBS)
NEEDS_HAVE_png = $(HAVE_PNG)
NEEDS_PACKAGE_png = libpng (libpng-dev)
ifeq ($(MAKELEVEL),0)
  ifeq ($(filter clean help,$(MAKECMDGOALS)),)
    $(info config: libpng       $(call yesno,$(HAVE_PNG)))
  endif
endif

# ---- make lesson-06 without a checkpoint: lesson 04's solution trains one (2 epochs: the second evaluation is the
# one the inference must reproduce). Made once; delete the file to train again.
LESSON06_DEMO_CKPT := results/lesson06-demo.ckpt
LESSON06_DEMO_TRAIN := --dataset synthetic --model tiny-bn --width 8 --epochs 2 --batch-size 64 --lr 0.02
# (mk/lessons.mk expands ARGS into lesson-06's recipe when it is read: hence a global override, for this goal only.)
ifneq ($(filter lesson-06,$(MAKECMDGOALS)),)
  ifeq ($(findstring --checkpoint,$(ARGS)),)
    override ARGS += --checkpoint $(LESSON06_DEMO_CKPT) --model tiny-bn --width 8 \
                     --confusion results/confusion-synthetic.csv
lesson-06: $(LESSON06_DEMO_CKPT)
  endif
endif
$(LESSON06_DEMO_CKPT): | $(BUILD)/solutions/04-checkpoint/train
	@mkdir -p $(dir $@)
	@echo "lesson-06: no --checkpoint in ARGS: training one with lesson 04's solution (2 ranks, a few seconds) -> $@"
	scripts/launch.sh 2 $(BUILD)/solutions/04-checkpoint/train $(LESSON06_DEMO_TRAIN) --checkpoint $@

# ---- make test-runs: lesson 06's short run evaluates a checkpoint that lesson 04's solution writes (as above).
QUICK_RUN_CKPT := $(BUILD)/quick-runs/lesson06.ckpt
QUICK_ARGS_06-inference = --model tiny-bn --width 8 --checkpoint $(abspath $(QUICK_RUN_CKPT))
test-run-06: $(QUICK_RUN_CKPT)
$(QUICK_RUN_CKPT): $(BUILD)/solutions/04-checkpoint/train
	@mkdir -p $(@D) && rm -f $@
	@scripts/launch.sh 2 $< $(LESSON06_DEMO_TRAIN) --checkpoint $@ >$@.log 2>&1 || { cat $@.log; exit 1; }

# ---- the bench against PyTorch (bench/inference.sh; PyTorch is needed only there, never by the kit)
.PHONY: bench-inference
HELP_TARGETS += bench-inference
bench-inference: $(BUILD)/solutions/06-inference/train | $(BUILD)/solutions/04-checkpoint/train
	bench/inference.sh $(BUILD)/solutions/06-inference/train $(BUILD)/solutions/04-checkpoint/train

# ---- make test-lesson06 (mk/lessons.mk runs tests/lesson06/run-tests.sh): lesson 04's program writes checkpoints
# on 1 and 2 ranks for it, when Open MPI is found.
ifneq ($(HAVE_MPI),)
test-lesson06: $(BUILD)/solutions/04-checkpoint/train
endif

# ---- the image reader (solutions/06-inference/image.c) alone, for tests/lesson06/test_images.py (run by
# run-tests.sh): it prints what it read from a file, which the test compares with PIL's reading of it.
LESSON06_PROBE := $(BUILD)/tests/lesson06/image_probe
$(LESSON06_PROBE): tests/lesson06/probe/image_probe.c solutions/06-inference/image.c solutions/06-inference/lesson.h \
                   $(KIT_HEADERS) $(KIT_LIB)
	@mkdir -p $(@D)
	$(say) LINK $@
	$(Q)$(CC) $(CPPFLAGS) -Isolutions/06-inference $(PNG_CFLAGS) $(CFLAGS) $(filter %.c,$^) -o $@ $(LDFLAGS) \
	  $(KIT_LIB) $(PNG_LIBS) $(LDLIBS)
ifneq ($(HAVE_PNG),)
test-lesson06: $(LESSON06_PROBE)
ALL_TARGETS += $(LESSON06_PROBE)
endif

# ======================================================================== lessons, starters, the autograder, grading

# Lesson programs, generated starters, the autograder and grading. Lessons are found by
# pattern: adding solutions/NN-name/ (and tests/lessonNN/) needs no change here.
#
# solutions/NN-name/  the one source; lessons/NN-name/ is generated from it (scripts/make-starters)
# A lesson's program is every .c file of its folder (main() in train.c, inside #ifndef AUTOGRADER),
# plus its .cu files when CUDA is built. Outputs:
#   $(BUILD)/solutions/NN-name/train        $(BUILD)/lessons/NN-name/train
#   $(BUILD)/grade-solutions/test_lessonNN  $(BUILD)/grade-lessons/test_lessonNN
# The autograder binary is tests/lessonNN/*.c (cmocka, main from tests/grading.h) linked with the
# lesson's sources built with -DAUTOGRADER. A lesson's checks beyond the autograder (more world sizes, a killed
# rank, ...) go in tests/lessonNN/run-tests.sh, run as `tests/lessonNN/run-tests.sh AUTOGRADER PROGRAM` on the
# solution by `make test-lessonNN` (part of `make test`).
#
# What a lesson needs beyond the kit: an optional solutions/NN-name/lesson.mk (copied to lessons/):
#   NEEDS := mpi        compile with Open MPI's flags, link $(DIST_LIBS) (MPI, and NCCL when found)
#   DEFAULT_NP := 2     ranks for `make lesson-NN` when NP= is not given (default 1)
#   GRADE_NP := 2       ranks the autograder test runs on (tests/grade.py launches it through scripts/launch.sh)
#   USES := 03-ddp      earlier lessons whose SOLUTION sources are linked in (without their main: -DAUTOGRADER,
#                       and with -DUSED_BY_LATER_LESSON, which leaves out what the later lesson defines its own
#                       of: lesson 04's run_program, which lesson 05 defines with its hooks), so what the learner
#                       built there comes complete from its one source (the lesson includes its header as
#                       "solutions/03-ddp/lesson.h"); a file (04-checkpoint/ckpt.c) links that file only
# It is always read from solutions/, so a learner's copy cannot change how the kit builds or grades.
#
# Variables: SOLUTIONS=1 (build/run/grade solutions/ instead of lessons/), NP=n, ARGS="..." (program options),
# LESSON=NN (grade one lesson), HINTS=full (`make grade`: hints with the exact calls, from
# tests/lessonNN/hints-full.tsv), LESSONS_DIR (where the learner's lessons are; the grader points it at a
# student's copy), GRADE_LESSONS_OUT (where their autograder binaries go), STRICT=1 (learner code with -Werror;
# without it, warnings in lessons/ are shown but do not stop the build).

LESSONS_DIR ?= lessons
GRADE_LESSONS_OUT ?= $(BUILD)/grade-lessons
GRADE_SOLUTIONS_OUT := $(BUILD)/grade-solutions
PYTHON ?= python3

LESSON_NAMES := $(sort $(patsubst solutions/%/,%,$(wildcard solutions/[0-9][0-9]-*/)))
lesson_num = $(firstword $(subst -, ,$(1)))

# Reads solutions/NN-name/lesson.mk into NEEDS_<name>, DEFAULT_NP_<name>, GRADE_NP_<name>.
define lesson_read_config
NEEDS :=
USES :=
DEFAULT_NP := 1
GRADE_NP := 1
include $(wildcard solutions/$(1)/lesson.mk)
NEEDS_$(1) := $$(NEEDS)
USES_$(1) := $$(USES)
DEFAULT_NP_$(1) := $$(DEFAULT_NP)
GRADE_NP_$(1) := $$(GRADE_NP)
endef
$(foreach l,$(LESSON_NAMES),$(eval $(call lesson_read_config,$(l))))
NEEDS :=
USES :=
# The objects of the earlier lessons a lesson uses (USES), in its object folder $(2): always from solutions/.
lesson_uses_obj = $(foreach u,$(USES_$(1)),$(patsubst solutions/%.c,$(2)/uses/%.o,$(filter %.c,$(wildcard solutions/$(u)/*.c solutions/$(u)))))
# The folder of a USES entry (03-ddp or 04-checkpoint/ckpt.c -> solutions/NN-name), for its headers.
lesson_uses_dir = solutions/$(firstword $(subst /, ,$(1)))

# Flags and libraries for what a lesson needs. Empty HAVE_<thing> means the lesson cannot be built here.
NEEDS_CPPFLAGS_mpi = $(MPI_CFLAGS)
NEEDS_LIBS_mpi = $(DIST_LIBS)
NEEDS_HAVE_mpi = $(HAVE_MPI)
NEEDS_PACKAGE_mpi = Open MPI (libopenmpi-dev + openmpi-bin)
lesson_missing = $(foreach n,$(NEEDS_$(1)),$(if $(NEEDS_HAVE_$(n)),,$(n)))

# Warnings stop the build of solutions always, and of learner code only with STRICT=1.
LEARNER_WERROR := $(if $(filter 1,$(STRICT)),,-Wno-error)
LEARNER_NVCCFLAGS = $(filter-out -Werror all-warnings,$(NVCCFLAGS)) -Xcompiler -Wno-error

# $(1) lesson folder name, $(2) source root, $(3) object folder, $(4) output binary, $(5) extra flags,
# $(6) the test sources (empty: the lesson's own program).
define lesson_program
$(3)/%.o: $(2)/$(1)/%.c $$(KIT_HEADERS) $$(wildcard $(2)/$(1)/*.h) $$(foreach u,$$(USES_$(1)),$$(wildcard $$(call lesson_uses_dir,$$(u))/*.h))
	@mkdir -p $$(@D)
	$$(say) CC $$<
	$$(Q)$$(CC) $$(CPPFLAGS) -I$(2)/$(1) $$(foreach n,$$(NEEDS_$(1)),$$(NEEDS_CPPFLAGS_$$(n))) $$(CFLAGS) $(5) -c $$< -o $$@

$(3)/uses/%.o: solutions/%.c $$(KIT_HEADERS) $$(wildcard solutions/*/*.h)
	@mkdir -p $$(@D)
	$$(say) CC $$<
	$$(Q)$$(CC) $$(CPPFLAGS) $$(foreach n,$$(NEEDS_$(1)),$$(NEEDS_CPPFLAGS_$$(n))) $$(CFLAGS) -DAUTOGRADER -DUSED_BY_LATER_LESSON -c $$< -o $$@

$(3)/%.cu.o: $(2)/$(1)/%.cu $$(KIT_HEADERS) $$(wildcard $(2)/$(1)/*.h)
	@mkdir -p $$(@D)
	$$(say) NVCC $$<
	$$(Q)$$(NVCC) $(if $(filter -Wno-error,$(5)),$$(LEARNER_NVCCFLAGS),$$(NVCCFLAGS)) -DKIT_CUDA -I$(2)/$(1) $$(filter -D%,$(5)) -c $$< -o $$@

$(4): $$(patsubst $(2)/$(1)/%.c,$(3)/%.o,$$(wildcard $(2)/$(1)/*.c)) $$(call lesson_uses_obj,$(1),$(3)) \
      $$(if $$(HAVE_CUDA),$$(patsubst $(2)/$(1)/%.cu,$(3)/%.cu.o,$$(wildcard $(2)/$(1)/*.cu))) \
      $(6) $$(KIT_LIB)
	@test -d $(2)/$(1) || { echo "$(2)/$(1) does not exist (maintainers: make starters)" >&2; exit 1; }
	@mkdir -p $$(@D)
	$$(say) LINK $$@
	$$(Q)$$(CC) $$(CPPFLAGS) -I$(2)/$(1) $(if $(6),$$(CMOCKA_CFLAGS)) \
	  $$(foreach n,$$(NEEDS_$(1)),$$(NEEDS_CPPFLAGS_$$(n))) $$(CFLAGS) $(5) \
	  $$(filter %.c %.o,$$^) -o $$@ $$(LDFLAGS) $$(KIT_LIB) \
	  $$(foreach n,$$(NEEDS_$(1)),$$(NEEDS_LIBS_$$(n))) $(if $(6),$$(CMOCKA_LIBS)) $$(LDLIBS)
endef

# Learner code is rebuilt on CONTENT, not on time: a file put back with its old time stamp (cp -p, tar, unzip,
# rsync -a, an older git checkout) is older than the object built from what it replaced, and make alone would
# link that object. $(3)/sources.sha256 lists the digests of the lesson folder's files; it is rewritten (and so
# becomes newer than every object) only when a name or a content changes, and every object depends on it.
# $(1) lesson folder name, $(2) source root, $(3) object folder.
lesson_sources = $(sort $(wildcard $(2)/$(1)/*.c $(2)/$(1)/*.h $(2)/$(1)/*.cu))
define lesson_content_stamp
$(3)/sources.sha256: lesson-sources-changed
	@mkdir -p $$(@D)
	@(cd $(2)/$(1) && sha256sum -- $$(notdir $$(call lesson_sources,$(1),$(2)))) >$$@.new
	@if cmp -s $$@.new $$@; then rm -f $$@.new; else mv -f $$@.new $$@; fi
$$(patsubst $(2)/$(1)/%.c,$(3)/%.o,$$(wildcard $(2)/$(1)/*.c)) \
$$(patsubst $(2)/$(1)/%.cu,$(3)/%.cu.o,$$(wildcard $(2)/$(1)/*.cu)): $(3)/sources.sha256
endef
.PHONY: lesson-sources-changed
lesson-sources-changed:

lesson_tests = $(sort $(wildcard tests/lesson$(call lesson_num,$(1))/*.c)) tests/grading.h tests/testutil.h
lesson_has_test = $(wildcard tests/lesson$(call lesson_num,$(1))/test_lesson$(call lesson_num,$(1)).c)

# `make lesson-NN [NP=n] [ARGS=...]`: builds and runs one lesson, through scripts/launch.sh for more than one rank.
define lesson_run
.PHONY: lesson-$(call lesson_num,$(1))
lesson-$(call lesson_num,$(1)): $(if $(filter 1,$(SOLUTIONS)),$(BUILD)/solutions,$(BUILD)/lessons)/$(1)/train
	$(if $(filter-out 0 1,$(or $(NP),$(DEFAULT_NP_$(1)))),scripts/launch.sh $(or $(NP),$(DEFAULT_NP_$(1))) )$$< $(ARGS)
endef

# Lessons whose needs are met are built and tested; the others say why they are left out.
LESSONS_BUILDABLE := $(foreach l,$(LESSON_NAMES),$(if $(call lesson_missing,$(l)),,$(l)))
LESSONS_SKIPPED := $(filter-out $(LESSONS_BUILDABLE),$(LESSON_NAMES))
LESSONS_GRADED := $(foreach l,$(LESSONS_BUILDABLE),$(if $(call lesson_has_test,$(l)),$(l)))

$(foreach l,$(LESSONS_BUILDABLE),\
  $(eval $(call lesson_program,$(l),solutions,$(BUILD)/solutions/$(l)/obj,$(BUILD)/solutions/$(l)/train,,))\
  $(eval $(call lesson_program,$(l),$(LESSONS_DIR),$(BUILD)/lessons/$(l)/obj,$(BUILD)/lessons/$(l)/train,$(LEARNER_WERROR),))\
  $(if $(wildcard $(LESSONS_DIR)/$(l)),$(eval $(call lesson_content_stamp,$(l),$(LESSONS_DIR),$(BUILD)/lessons/$(l)/obj)))\
  $(eval $(call lesson_run,$(l))))
$(foreach l,$(LESSONS_GRADED),\
  $(eval $(call lesson_program,$(l),solutions,$(GRADE_SOLUTIONS_OUT)/$(l),$(GRADE_SOLUTIONS_OUT)/test_lesson$(call lesson_num,$(l)),-DAUTOGRADER,$(call lesson_tests,$(l))))\
  $(eval $(call lesson_program,$(l),$(LESSONS_DIR),$(GRADE_LESSONS_OUT)/$(l),$(GRADE_LESSONS_OUT)/test_lesson$(call lesson_num,$(l)),-DAUTOGRADER $(LEARNER_WERROR),$(call lesson_tests,$(l))))\
  $(if $(wildcard $(LESSONS_DIR)/$(l)),$(eval $(call lesson_content_stamp,$(l),$(LESSONS_DIR),$(GRADE_LESSONS_OUT)/$(l)))))
$(foreach l,$(LESSONS_SKIPPED),$(eval lesson-$(call lesson_num,$(l)) $(BUILD)/solutions/$(l)/train $(BUILD)/lessons/$(l)/train: ; \
  @echo "lesson $(l) needs $(foreach n,$(call lesson_missing,$(l)),$(NEEDS_PACKAGE_$(n))), not found: run make deps" >&2; exit 1))
ifeq ($(MAKELEVEL),0)
  $(foreach l,$(LESSONS_SKIPPED),$(info config: lesson $(l) left out: needs $(call lesson_missing,$(l))))
endif

ALL_TARGETS += $(foreach l,$(LESSONS_BUILDABLE),$(BUILD)/solutions/$(l)/train $(BUILD)/lessons/$(l)/train) \
               $(foreach l,$(LESSONS_GRADED),$(GRADE_SOLUTIONS_OUT)/test_lesson$(call lesson_num,$(l)))
TEST_TARGETS += check-starters grade-solutions grade-starters
HELP_TARGETS += starters check-starters grade grade-solutions grade-starters \
                $(foreach l,$(LESSON_NAMES),lesson-$(call lesson_num,$(l)))

# Options every grading run passes down: the build folder and the lessons it may grade.
GRADE_PY = $(PYTHON) tests/grade.py --build $(BUILD) $(foreach l,$(LESSONS_SKIPPED),--skip $(call lesson_num,$(l))) \
           $(GRADE_EMU_ARGS)  # GPU tests skipped here run again in the emulator

.PHONY: starters check-starters grade grade-solutions grade-starters
# Rewrites lessons/ from solutions/ (maintainers: this overwrites a learner's edits in lessons/).
starters:
	$(PYTHON) scripts/make-starters

check-starters:
	@$(PYTHON) scripts/make-starters --check

# The learner's command: grades lessons/ (or solutions/ with SOLUTIONS=1) and prints the score table.
grade: $(KIT_LIB)
	@$(if $(HINTS),GRADE_HINTS=$(HINTS) )$(GRADE_PY) $(if $(LESSON),--lesson $(LESSON)) $(if $(filter 1,$(SOLUTIONS)),--solutions)

# The instructor's class run (tests/GRADING.md), with the same options as `make grade`: the build folder, the
# lessons this machine cannot build left out, GPU tests in the CUDA emulator when there is no GPU.
# make grade-class SUBMISSIONS=dir OUT=dir [LESSON=NN] [JOBS=2]
.PHONY: grade-class
HELP_TARGETS += grade-class
grade-class: $(KIT_LIB)
	@test -n "$(SUBMISSIONS)" -a -n "$(OUT)" || { echo "usage: make grade-class SUBMISSIONS=dir OUT=dir [LESSON=NN] [JOBS=n]" >&2; exit 2; }
	@$(GRADE_PY) --submissions $(SUBMISSIONS) --out $(OUT) $(if $(LESSON),--lesson $(LESSON)) --jobs $(or $(JOBS),1)

# CI: every autograder test passes on the solutions and fails on the starters.
grade-solutions: $(KIT_LIB)
	@$(GRADE_PY) --solutions --expect pass

# make test-quick: the autograder itself works on this machine, in one process (lesson 01) and under mpirun (03);
# every lesson's program still runs once there (test-runs). Grading every solution takes 3 minutes more on 2 cores.
.PHONY: grade-quick
HELP_TARGETS += grade-quick
grade-quick: $(KIT_LIB)
	@$(GRADE_PY) --solutions --expect pass --lesson 01 --lesson 03

grade-starters: $(KIT_LIB)
	@set -o pipefail; $(GRADE_PY) --expect fail --make-arg STRICT=1 --lessons-dir lessons | tee $(BUILD)/grade-starters.txt

# ---------------------------------------------------------------- one short run of each lesson's solution (make test-quick)
# `make test-runs`: every lesson's solution program runs once as `make lesson-NN` would start it (DEFAULT_NP
# ranks, the best device), on the synthetic set for one epoch, in $(BUILD)/quick-runs/NN/; it must exit 0 and
# print its `final:` line once. A lesson that needs other options sets QUICK_ARGS_<folder name> (lesson 06, above).
QUICK_ARGS := --dataset synthetic --model tiny --width 8 --epochs 1 --batch-size 64
# Lesson 11 splits residual blocks, which tiny has none of: ResNet-9 at the same width.
QUICK_ARGS_11-tensor = --dataset synthetic --model resnet9 --width 8 --epochs 1 --batch-size 64
define lesson_quick_run
.PHONY: test-run-$(2)
test-run-$(2): $(BUILD)/solutions/$(1)/train
	@mkdir -p $(BUILD)/quick-runs/$(2)
	@cd $(BUILD)/quick-runs/$(2) && \
	  $(if $(filter-out 0 1,$(DEFAULT_NP_$(1))),$(CURDIR)/scripts/launch.sh $(DEFAULT_NP_$(1)) )$(CURDIR)/$$< \
	  $$(or $$(QUICK_ARGS_$(1)),$$(QUICK_ARGS)) >run.log 2>&1 || { cat run.log; echo "test-run-$(2): lesson $(1) failed" >&2; exit 1; }
	@n=$$$$(grep -c '^final:' $(BUILD)/quick-runs/$(2)/run.log); [ "$$$$n" = 1 ] || \
	  { cat $(BUILD)/quick-runs/$(2)/run.log; echo "test-run-$(2): $$$$n 'final:' lines, not 1" >&2; exit 1; }
	@echo "test-run-$(2): $$$$(grep -m1 '^final:' $(BUILD)/quick-runs/$(2)/run.log | cut -c1-110)"
endef
$(foreach l,$(LESSONS_BUILDABLE),$(eval $(call lesson_quick_run,$(l),$(call lesson_num,$(l)))))
.PHONY: test-runs
HELP_TARGETS += test-runs test-quick
test-runs: $(foreach l,$(LESSONS_BUILDABLE),test-run-$(call lesson_num,$(l)))
	@echo "test-runs: $(words $^) lessons ran$(if $(LESSONS_SKIPPED), ($(LESSONS_SKIPPED) left out: see config:))"

# ---------------------------------------------------------------- a lesson's extra checks (tests/lessonNN/run-tests.sh)
lesson_extra = $(wildcard tests/lesson$(call lesson_num,$(1))/run-tests.sh)
define lesson_extra_rule
.PHONY: test-lesson$(2)
HELP_TARGETS += test-lesson$(2)
ifneq ($(filter $(1),$(LESSONS_GRADED)),)
TEST_TARGETS += test-lesson$(2)
test-lesson$(2): $(GRADE_SOLUTIONS_OUT)/test_lesson$(2) $(BUILD)/solutions/$(1)/train
	@tests/lesson$(2)/run-tests.sh $$^
else
test-lesson$(2):
	@echo "test-lesson$(2): skipped: lesson $(1) needs $(foreach n,$(call lesson_missing,$(1)),$(NEEDS_PACKAGE_$(n))) (make deps)"
endif
endef
$(foreach l,$(LESSON_NAMES),$(if $(call lesson_extra,$(l)),$(eval $(call lesson_extra_rule,$(l),$(call lesson_num,$(l))))))

# ---- grader self-tests: tests/grade.py against hostile and broken submissions, on a
# minimal fake lesson (tests/machinery/grader/), and two checks on the kit itself (lesson 01: a restored starter is
# rebuilt; a class run grades like make grade); about three minutes.
.PHONY: test-grader
TEST_TARGETS += test-grader
HELP_TARGETS += test-grader
test-grader:
	@GRADER_KIT_BUILD=$(BUILD) $(PYTHON) tests/machinery/grader/test_grader.py

# ---- README examples of `make grade`: each lesson README's example of the starter's score table
# (after its <!-- grade-excerpt --> line) must be what the starter prints; read from grade-starters' output.
.PHONY: check-grade-excerpts
TEST_TARGETS += check-grade-excerpts
HELP_TARGETS += check-grade-excerpts
# Under SANITIZE=1 too: a failed test's leaks (fail() jumps past its frees) are not reported (tests/grading.h,
# __lsan_is_turned_off), so the sanitizer build prints the same score table as a learner's.
check-grade-excerpts:
	@$(PYTHON) scripts/check-grade-excerpts --build $(BUILD) --from $(BUILD)/grade-starters.txt
