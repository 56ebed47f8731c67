# mk/inference.mk: lesson 06 (inference from a checkpoint). Included before mk/lessons.mk: the lesson says NEEDS := png, and
# mk/lessons.mk decides which lessons can be built from the NEEDS_HAVE_* below.
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
