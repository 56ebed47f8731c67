# mk/extras.mk: `make run`, slides, plots and benchmarks.
#
#   make run      install what is missing, build lesson 01's solution, get data, train (ARGS="..." adds options)
#   make slides   slides/NN-name.md -> slides/NN-name.pdf (pandoc + beamer; TikZ inside the Markdown
#                 or \input{file.tex} of a file in slides/); instructor notes (*.notes.md) are not decks;
#                 a deck with text off a slide or unrendered Markdown fails (scripts/build-slides.py)
#   make plot     results/*.csv (or METRICS="a.csv b.csv") -> PNG curves next to them (gnuplot)
#   make bench-cpu        kit vs PyTorch on the CPU, resnet9 + fmnist at batch 128 -> bench/results-cpu.md
#   make bench-gpu        resnet9 training throughput on one GPU beside PyTorch, + the overlapped copy -> bench/results-gpu.md
#   make bench-allreduce  all-reduce bandwidth 1 KB..64 MB (MPI; NCCL too on GPUs; gloo beside MPI) -> bench/results-allreduce.md
#   make bench-ddp        lesson 03's DDP against PyTorch DDP (gloo), 1 and 2 CPU ranks -> bench/results-ddp-torch.md

RUN_LESSON := 01-single-gpu
RUN_BIN := $(BUILD)/solutions/$(RUN_LESSON)/train
RUN_METRICS_DIR := results

.PHONY: run slides plot
# The build and the data step run in sub-makes/scripts started AFTER install-deps, so what it installs is
# found (this make read mk/config.mk before anything was installed).
run:
	@scripts/install-deps.sh
	@$(MAKE) --no-print-directory $(RUN_BIN)
	@set -o pipefail; mkdir -p $(BUILD) $(RUN_METRICS_DIR); \
	if [ -x datasets/get-data.sh ]; then \
	  datasets/get-data.sh | tee $(BUILD)/get-data.log || { echo "make run: datasets/get-data.sh failed" >&2; exit 1; }; \
	  last=$$(tail -n 1 $(BUILD)/get-data.log); \
	else \
	  echo "make run: datasets/get-data.sh not found; training on the synthetic set"; \
	  last="dataset=synthetic dir=datasets/data"; \
	fi; \
	name=$$(sed -n 's/.*dataset=\([^ ]*\).*/\1/p' <<< "$$last"); \
	dir=$$(sed -n 's/.*dir=\(.*\)$$/\1/p' <<< "$$last"); \
	if [ -z "$$name" ] || [ -z "$$dir" ]; then \
	  echo "make run: expected 'dataset=NAME dir=PATH' as the last line of datasets/get-data.sh, got: $$last" >&2; \
	  exit 1; \
	fi; \
	metrics=$(RUN_METRICS_DIR)/run-$$name.csv; rm -f "$$metrics"; \
	quick=""; \
	if ! nvidia-smi -L >/dev/null 2>&1; then \
	  case "$$name" in \
	    fashion-mnist) quick="--epochs 3";; \
	    cifar10|cifar100) quick="--width 16 --epochs 4";; \
	  esac; \
	  [ -n "$$quick" ] && echo "make run: no GPU, so a short CPU schedule ($$quick); the README lists the full ones"; \
	fi; \
	echo "make run: $(RUN_BIN) --dataset $$name --data-dir $$dir --metrics $$metrics $$quick $(ARGS)"; \
	$(RUN_BIN) --dataset "$$name" --data-dir "$$dir" --metrics "$$metrics" $$quick $(ARGS) && \
	echo "make run: per-epoch metrics in $$metrics; \`make plot\` draws them"

# ---------------------------------------------------------------- slides
SLIDES_MD := $(filter-out %.notes.md,$(wildcard slides/[0-9][0-9]-*.md))
SLIDES_PDF := $(SLIDES_MD:.md=.pdf)
# scripts/build-slides.py runs pandoc (pdflatex in a temporary folder: TEXINPUTS lets \input{diagram.tex} find
# files in slides/) and FAILS the deck on text that runs off a slide (an overfull box over 1 pt in LaTeX's log)
# or Markdown left unrendered in the PDF (a literal ** or backtick), so neither comes back unseen.
slides/%.pdf: slides/%.md $(wildcard slides/*.tex) scripts/build-slides.py
	@scripts/build-slides.py $< $@

slides: $(SLIDES_PDF)
	@echo "make slides: $(words $(SLIDES_PDF)) deck(s): $(SLIDES_PDF)"

# ---------------------------------------------------------------- documents against their one source
# Every fact the documents repeat (the lessons and decks, from their folders; what ran on a GPU, from
# bench/results-gpu-check.md; which earlier solution files a lesson runs on, from its lesson.mk) is checked
# against that source (tools/check_docs.py says which places); then stale lines are planted in a copy, and each
# must fail (the checker's own test). A second.
.PHONY: check-docs
TEST_TARGETS += check-docs
HELP_TARGETS += check-docs
check-docs:
	@$(PYTHON) tools/check_docs.py
	@mkdir -p $(BUILD); $(PYTHON) tools/check_docs.py --self-test >$(BUILD)/check-docs-self-test.txt 2>&1 || \
	  { cat $(BUILD)/check-docs-self-test.txt; echo "check-docs: its self-test failed" >&2; exit 1; }
	@tail -n 1 $(BUILD)/check-docs-self-test.txt

# ---------------------------------------------------------------- plots
METRICS ?= $(wildcard $(RUN_METRICS_DIR)/*.csv)
plot:
	@if [ -z "$(strip $(METRICS))" ]; then \
	  echo "make plot: no metrics CSV in $(RUN_METRICS_DIR)/ (make run writes one; or METRICS=path.csv)" >&2; exit 1; \
	fi
	@scripts/plot-metrics.sh $(METRICS)

HELP_TARGETS += run slides plot

# ---- lesson 05: plain BN vs SyncBN at 1-2 images per rank, bench/run-syncbn.sh's CSV -> PNG
.PHONY: plot-syncbn
HELP_TARGETS += plot-syncbn
plot-syncbn:            # bench/figures/syncbn-gap.csv -> bench/figures/syncbn-gap.png (bench/results-syncbn.md)
	@bench/plot-syncbn.sh bench/figures/syncbn-gap.csv

# ---- lesson 08: the pipeline schedules' idle fraction, stored micro-batches and step time against M:
# bench/results-pipeline.csv (bench/pipeline-bubble.sh), the schedule simulator, PyTorch's rows if there are
# any (bench/torch_pipeline.py --out bench/results-pipeline-torch.csv) -> bench/figures/pipeline-bubble.png
PIPELINE_SIM := $(BUILD)/bench/pipeline_simulate
$(PIPELINE_SIM): bench/pipeline_simulate.c solutions/08-pipeline/schedule.c solutions/08-pipeline/schedule.h $(KIT_LIB)
	@mkdir -p $(dir $@)
	$(say) LINK $@
	$(Q)$(CC) $(CPPFLAGS) $(CFLAGS) $(filter %.c,$^) -o $@ $(LDFLAGS) $(KIT_LIB) $(LDLIBS)
ALL_TARGETS += $(PIPELINE_SIM)
.PHONY: plot-pipeline
HELP_TARGETS += plot-pipeline
plot-pipeline: $(PIPELINE_SIM)
	@python3 bench/plot_pipeline.py --simulator $(PIPELINE_SIM)
# Lesson 08's bytes on the wire and stored activations per rank and step, measured (bench/pipeline-wire.sh):
# the solution's stage code linked into a small driver that reads the process group's traffic counters and VmHWM.
PIPELINE_WIRE := $(BUILD)/bench/pipeline_wire
ifeq ($(HAVE_MPI),yes)
$(PIPELINE_WIRE): bench/pipeline_wire.c solutions/08-pipeline/pipe.c solutions/08-pipeline/pipe_dist.c \
                  solutions/08-pipeline/schedule.c solutions/08-pipeline/lesson.h $(KIT_LIB)
	@mkdir -p $(dir $@)
	$(say) LINK $@
	$(Q)$(CC) $(CPPFLAGS) $(MPI_CFLAGS) $(CFLAGS) -Isolutions/08-pipeline $(filter %.c,$^) -o $@ \
	  $(LDFLAGS) $(KIT_LIB) $(DIST_LIBS) $(LDLIBS)
ALL_TARGETS += $(PIPELINE_WIRE)
.PHONY: bench-pipeline-wire
HELP_TARGETS += bench-pipeline-wire
bench-pipeline-wire: $(PIPELINE_WIRE) $(BUILD)/bench/ddp_kit
	@BUILD=$(BUILD) bench/pipeline-wire.sh
endif
# The torch peer's cut and stages against the lesson's program, and the plot script (about a minute)
.PHONY: test-pipeline-tools
TEST_TARGETS += test-pipeline-tools
HELP_TARGETS += test-pipeline-tools
test-pipeline-tools: $(BUILD)/solutions/08-pipeline/train $(PIPELINE_SIM)
	@python3 tests/bench/test_pipeline_tools.py $^

# ---- lesson 09: per-rank memory by part (params, grads, optimizer, activations, comm) for DDP and ZeRO 1-3:
# bench/zero_memory.py's arithmetic (with the kit's per-unit arenas from bench_zeromem) and any measured rows
# (source=kit, source=torch) in the same columns -> bench/figures/zero-memory.png
ZERO_PROBE := $(BUILD)/bench/bench_zeromem
ALL_TARGETS += $(ZERO_PROBE)
.PHONY: plot-memory test-zero-tools
HELP_TARGETS += plot-memory test-zero-tools
plot-memory: $(ZERO_PROBE)
	@[ -s bench/results-zero-memory-arith.csv ] || python3 bench/zero_memory.py --probe $(ZERO_PROBE) --budgets-mib "" >/dev/null
	@python3 bench/plot_memory.py
# The arithmetic against an independent count from the kit's own table, the budget search, the plot, and (with
# PyTorch) the peers' units and shards (a 2-rank run: about a minute on a quiet machine)
TEST_TARGETS += test-zero-tools
test-zero-tools: $(ZERO_PROBE)
	@python3 tests/bench/test_zero_tools.py $<

# ---------------------------------------------------------------- benchmarks (bench/README.md)
# One rule builds every bench/bench_NAME.c; those whose needs are missing here are left out of `all`.
$(BUILD)/bench/bench_%: bench/bench_%.c bench/gpu_step.h $(KIT_LIB)
	@mkdir -p $(dir $@)
	$(say) LINK $@
	$(Q)$(CC) $(CPPFLAGS) $(MPI_CFLAGS) $(CFLAGS) $< -o $@ $(LDFLAGS) $(KIT_LIB) $(DIST_LIBS) $(LDLIBS)

BENCH_CPU_ARGS ?=
# bench_profile: the float32 step per kernel and per conv layer (scripts/gpu-check.sh profile; runs in EMU=1 too)
ALL_TARGETS += $(if $(HAVE_CUDA),$(BUILD)/bench/bench_profile)
ALL_TARGETS += $(BUILD)/bench/bench_cpu $(if $(HAVE_CUDA),$(BUILD)/bench/bench_gpu) \
               $(if $(filter yes,$(HAVE_MPI)),$(BUILD)/bench/bench_allreduce)
HELP_TARGETS += bench-cpu bench-gpu bench-allreduce
.PHONY: bench-cpu bench-gpu bench-allreduce

bench-cpu: $(BUILD)/bench/bench_cpu
	@python3 -c "import torch" 2>/dev/null || { echo "bench-cpu: needs PyTorch (CPU) in python3: pip install torch"; exit 1; }
	python3 bench/torch_cpu.py --kit-bin $< --out bench/results-cpu.md $(BENCH_CPU_ARGS)
	@cat bench/results-cpu.md

bench-gpu: $(BUILD)/bench/bench_gpu
	python3 bench/torch_gpu.py --kit $< --batch $(or $(BATCH),512) --out bench/results-gpu.md

ifeq ($(HAVE_MPI),yes)
bench-allreduce: $(BUILD)/bench/bench_allreduce
	@bench/run-allreduce.sh $< bench/results-allreduce.md
else
bench-allreduce:
	@echo "$@: skipped: Open MPI was not found (install libopenmpi-dev + openmpi-bin: make deps)"
endif

# Lesson 03's DDP loop against PyTorch DDP (gloo) on the same machine: bench/ddp_kit.c links the solution's
# train.c (its main renamed by -DAUTOGRADER) and times a fixed number of steps; bench/torch_ddp.py alternates it
# with torchrun + DistributedDataParallel. BENCH_DDP_ARGS="--rounds 5" for a steadier run, "--quick": seconds.
DDP_KIT := $(BUILD)/bench/ddp_kit
HELP_TARGETS += bench-ddp
.PHONY: bench-ddp
ifeq ($(HAVE_MPI),yes)
$(DDP_KIT): bench/ddp_kit.c solutions/03-ddp/train.c solutions/03-ddp/lesson.h $(KIT_LIB)
	@mkdir -p $(dir $@)
	$(say) LINK $@
	$(Q)$(CC) $(CPPFLAGS) $(MPI_CFLAGS) $(CFLAGS) -DAUTOGRADER -Isolutions/03-ddp $< solutions/03-ddp/train.c -o $@ \
	  $(LDFLAGS) $(KIT_LIB) $(DIST_LIBS) $(LDLIBS)
ALL_TARGETS += $(DDP_KIT)
bench-ddp: $(DDP_KIT)
	@python3 -c "import torch" 2>/dev/null || { echo "bench-ddp: needs PyTorch (CPU) in python3: pip install torch"; exit 1; }
	python3 bench/torch_ddp.py --kit-bin $< --out bench/results-ddp-torch.md $(BENCH_DDP_ARGS)
else
bench-ddp:
	@echo "$@: skipped: Open MPI was not found (install libopenmpi-dev + openmpi-bin: make deps)"
endif

# Lesson 09 measured on the kit (bench/zero_bench.py): per-rank memory by part from the allocation counters,
# bytes handed to the collectives, step time, the largest width per budget, recomputation; beside the arithmetic
# (bench/zero_memory.py) and PyTorch's rows if bench/results-zero-torch.csv exists -> bench/results-zero.md + CSV.
# BENCH_ZERO_ARGS="--quick" for a run of seconds.
ZERO_KIT := $(BUILD)/bench/zero_kit
BENCH_ZERO_ARGS ?=
HELP_TARGETS += bench-zero
.PHONY: bench-zero
ifeq ($(HAVE_MPI),yes)
$(ZERO_KIT): bench/zero_kit.c solutions/09-zero/zero.c solutions/09-zero/lesson.h solutions/03-ddp/train.c \
             solutions/03-ddp/lesson.h $(KIT_LIB)
	@mkdir -p $(dir $@)
	$(say) LINK $@
	$(Q)$(CC) $(CPPFLAGS) $(MPI_CFLAGS) $(CFLAGS) -DAUTOGRADER -Isolutions/09-zero $(filter %.c,$^) -o $@ \
	  $(LDFLAGS) $(KIT_LIB) $(DIST_LIBS) $(LDLIBS)
ALL_TARGETS += $(ZERO_KIT)
bench-zero: $(ZERO_KIT) $(BUILD)/bench/bench_zeromem
	@if python3 -c "import torch" 2>/dev/null; then case "$(BENCH_ZERO_ARGS)" in *--quick*) ;; *) \
	  nice python3 bench/torch_zero.py --worlds 2 --csv bench/results-zero-torch-w2.csv \
	    --md bench/results-zero-torch-w2.md;; esac; else echo "bench-zero: no PyTorch: section 5 left out"; fi
	nice python3 bench/zero_bench.py --kit-bin $(ZERO_KIT) --probe $(BUILD)/bench/bench_zeromem \
	  --torch-csv bench/results-zero-torch-w2.csv $(BENCH_ZERO_ARGS)
else
bench-zero:
	@echo "$@: skipped: Open MPI was not found (install libopenmpi-dev + openmpi-bin: make deps)"
endif
# The kit's measured model states equal the arithmetic's (1 and 3 ranks, every stage), the ring bytes the closed
# form, and bench-zero's --quick harness runs (about a minute)
.PHONY: test-zero-bench
TEST_TARGETS += test-zero-bench
HELP_TARGETS += test-zero-bench
ifeq ($(HAVE_MPI),yes)
test-zero-bench: $(ZERO_KIT) $(BUILD)/bench/bench_zeromem
	@python3 tests/bench/test_zero_bench.py $^
else
test-zero-bench:
	@echo "$@: skipped: Open MPI was not found (install libopenmpi-dev + openmpi-bin: make deps)"
endif

# The comparisons with PyTorch (bench-ddp, and gloo in bench-allreduce and bench-ring) in their --quick modes: the
# harness runs end to end (about 35 s of CPU, mostly `import torch`; skipped without PyTorch or Open MPI). Measures nothing.
.PHONY: test-bench-quick
TEST_TARGETS += test-bench-quick
HELP_TARGETS += test-bench-quick
ifeq ($(HAVE_MPI),yes)
test-bench-quick: $(DDP_KIT) $(BUILD)/bench/bench_allreduce $(BUILD)/bench/ring_allreduce
	@bench/quick.sh $(BUILD)
else
test-bench-quick:
	@echo "$@: skipped: Open MPI was not found (install libopenmpi-dev + openmpi-bin: make deps)"
endif

# The benchmarks' measure of other work on the machine (bench/cpu_share.py) counts what it should.
.PHONY: test-bench-tools
TEST_TARGETS += test-bench-tools
HELP_TARGETS += test-bench-tools
test-bench-tools:
	@python3 tests/bench/test_cpu_share.py

# ---- lesson 10's benchmarks (bench/README.md, "Lesson 10: low precision and large batches").
#
#   make bench-lowp       real bf16 GEMMs: oneDNN's bf16 matmul against OpenBLAS sgemm (CPU), cuBLAS bf16 / fp16
#                         tensor cores against sgemm and TF32 (GPU, when there is one) -> bench/results-lowp.md
#   make bench-autocast   PyTorch autocast on the kit's fmnist net and ResNet-9: images/s and peak memory, fp32
#                         against bf16 (CPU; + tf32, bf16, fp16 + GradScaler on a GPU) -> bench/results-autocast.md
#   make bench-precision  lesson 10's program under each precision: first its speed and memory against PyTorch
#                         autocast (ResNet-9, batch 64 on the CPU, 512 on a GPU when there is one; fp32, TF32, bf16,
#                         fp16 + loss scaling; a few minutes on 2 cores) -> bench/results-precision-speed.md, then
#                         its accuracy on Fashion-MNIST -> bench/results-precision.md
#   make bench-batch      lesson 10's program at global batch 64..4096 under each lr rule -> bench/results-batch.md
#   make plot-batch       bench/results-batch.csv -> bench/figures/batch.png (gnuplot)
# SPEED_ARGS / PRECISION_ARGS / BATCH_ARGS / AUTOCAST_ARGS / LOWP_ARGS pass options on (e.g. BATCH_ARGS="--epochs 1",
# SPEED_ARGS="--rounds 3").

# oneDNN (HAVE_DNNL, mk/config.mk): this benchmark times its bf16 matmul against sgemm.
GEMM_LOWP_CPU := $(BUILD)/bench/gemm_lowp_cpu
GEMM_LOWP := $(BUILD)/bench/gemm_lowp
LESSON10_TRAIN := $(BUILD)/solutions/10-precision/train
HELP_TARGETS += bench-lowp bench-autocast bench-precision bench-batch plot-batch test-precision-bench
.PHONY: bench-lowp bench-autocast bench-precision bench-batch plot-batch test-precision-bench

ifeq ($(HAVE_DNNL),yes)
$(GEMM_LOWP_CPU): bench/gemm_lowp_cpu.c bench/gemm_shapes.h $(KIT_LIB)
	@mkdir -p $(dir $@)
	$(say) LINK $@
	$(Q)$(CC) $(CPPFLAGS) $(CFLAGS) $< -o $@ $(LDFLAGS) $(KIT_LIB) $(LDLIBS)
ALL_TARGETS += $(GEMM_LOWP_CPU)
endif
# A real GPU build only: the emulator has no tensor cores to time.
ifneq ($(EMU),1)
ifneq ($(HAVE_CUDA),)
# Only the kit's check.o (CHECK macros): a GPU machine builds it in seconds without the rest of the kit.
$(GEMM_LOWP): bench/gemm_lowp.cu bench/gemm_shapes.h $(BUILD)/kit/check.o
	@mkdir -p $(dir $@)
	$(say) NVCC $@
	$(Q)$(NVCC) $(NVCCFLAGS) $< $(BUILD)/kit/check.o -o $@ -L$(CUDA_LIBDIR) -Xlinker -rpath,$(CUDA_LIBDIR) -lcublas
ALL_TARGETS += $(GEMM_LOWP)
endif
endif

bench-lowp: $(if $(filter yes,$(HAVE_DNNL)),$(GEMM_LOWP_CPU)) $(if $(and $(HAVE_CUDA),$(filter-out 1,$(EMU))),$(GEMM_LOWP))
	@bench/run-lowp.sh $(BUILD) bench/results-lowp.md $(LOWP_ARGS)

bench-autocast:
	@python3 -c "import torch" 2>/dev/null || { echo "bench-autocast: skipped: no PyTorch in python3 (pip install torch)"; exit 0; }; \
	  python3 bench/torch_autocast.py --out bench/results-autocast.md $(AUTOCAST_ARGS)

# Lesson 10's program is built when the lesson is there (solutions/10-precision) and Open MPI is found;
# bench/precision_runs.py says "skipped" without it.
bench-precision: $(if $(and $(wildcard solutions/10-precision/train.c),$(filter yes,$(HAVE_MPI))),$(LESSON10_TRAIN))
	python3 bench/precision_runs.py speed --train $(LESSON10_TRAIN) $(SPEED_ARGS)
	python3 bench/precision_runs.py accuracy --train $(LESSON10_TRAIN) $(PRECISION_ARGS)
bench-batch: $(if $(and $(wildcard solutions/10-precision/train.c),$(filter yes,$(HAVE_MPI))),$(LESSON10_TRAIN))
	python3 bench/precision_runs.py batch --train $(LESSON10_TRAIN) $(BATCH_ARGS)
plot-batch:
	@python3 bench/precision_runs.py plot

# The scripts above in their quick modes (seconds; nothing measured): they still run and write their tables.
TEST_TARGETS += test-precision-bench
test-precision-bench: $(if $(filter yes,$(HAVE_DNNL)),$(GEMM_LOWP_CPU)) \
                      $(if $(and $(wildcard solutions/10-precision/train.c),$(filter yes,$(HAVE_MPI))),$(LESSON10_TRAIN))
	@bench/quick-precision.sh $(BUILD)

# ---- lesson 11's benchmark (bench/README.md, "Lesson 11: tensor parallelism"; bench/tp_bench.py):
#   make bench-tp        bytes per step per rank by group (tensor, data) against the arithmetic, memory per rank by part
#                        for TP = 1, 2, 4 against lesson 09's ZeRO-3, the largest ResNet-9 width per budget, images/s
#                        against data parallelism -> bench/results-tp.md + .csv, bench/figures/tp-memory.png
#                        (about 25 minutes on 2 cores; TP_ARGS="--sections traffic,memory" and the like pass options)
#   make plot-tp         bench/results-tp.csv -> bench/figures/tp-memory.png (gnuplot)
#   make test-tp-bench   the script's --quick mode (about a minute; part of make test): the harness, and bytes and
#                        model states equal to the arithmetic at tiny widths
LESSON11_TRAIN := $(BUILD)/solutions/11-tensor/train
LESSON09_TRAIN := $(BUILD)/solutions/09-zero/train
TP_BENCH_NEEDS := $(if $(and $(wildcard solutions/11-tensor/train.c),$(filter yes,$(HAVE_MPI))),$(LESSON11_TRAIN) $(LESSON09_TRAIN))
HELP_TARGETS += bench-tp plot-tp test-tp-bench
TEST_TARGETS += test-tp-bench
.PHONY: bench-tp plot-tp test-tp-bench
ifneq ($(TP_BENCH_NEEDS),)
bench-tp: $(TP_BENCH_NEEDS)
	nice python3 bench/tp_bench.py --train $(LESSON11_TRAIN) --zero-train $(LESSON09_TRAIN) --plot $(TP_ARGS)
test-tp-bench: $(TP_BENCH_NEEDS)
	@bench/quick-tp.sh $(LESSON11_TRAIN) $(LESSON09_TRAIN)
else
bench-tp test-tp-bench:
	@echo "$@: skipped: Open MPI was not found (install libopenmpi-dev + openmpi-bin: make deps)"
endif
plot-tp:
	@python3 bench/tp_bench.py --sections "" --plot

# ---------------------------------------------------------------- check-setup and slide figures (instructor guide)
.PHONY: check-setup test-check-setup
check-setup:            # what this machine has and lacks for each lesson; exit 0 when lesson 01 can run
	@scripts/check-setup.sh
test-check-setup:       # check-setup on imitated machines: no GPU, missing packages, a GPU outside CUDA_ARCH
	@tests/check-setup/run.sh
TEST_TARGETS += test-check-setup
HELP_TARGETS += check-setup test-check-setup slide-figures
# The decks' measured plots: bench/figures/*.csv -> slides/figures/*.png (committed; gnuplot only to redraw them)
.PHONY: slide-figures
slide-figures:
	gnuplot slides/figures/figures.gp
$(SLIDES_PDF): $(wildcard slides/figures/*.png)

# ---------------------------------------------------------------- GPU bundle: what a bare GPU machine lacks (OpenBLAS, cmocka, Open MPI, Fashion-MNIST),
# packed into the ignored gpu-bundle/ for scripts/gpu-check.sh; bench/GPU.md says how a GPU session uses it.
.PHONY: gpu-bundle
HELP_TARGETS += gpu-bundle
gpu-bundle:
	@scripts/gpu-bundle.sh

# ---------------------------------------------------------------- mutation testing of the autograder (not part of make test)
# make mutants [LESSON=NN] [JOBS=n] [LABEL=name]: each planted classic mistake (tests/machinery/mutants/lessonNN.tsv) graded
# by tests/grade.py; which test caught it -> tests/machinery/mutants/RESULTS.md (tests/machinery/mutants/run.py --help)
.PHONY: mutants
HELP_TARGETS += mutants
mutants: $(KIT_LIB)
	@$(PYTHON) tests/machinery/mutants/run.py --build $(BUILD) --emu-build $(EMU_BUILD) $(if $(LESSON),--lesson $(LESSON)) \
	  --jobs $(or $(JOBS),1) $(if $(LABEL),--label $(LABEL))

# ---------------------------------------------------------------- timelines (--trace FILE, kit/TRACING.md)
# make test-trace             lesson 03 on 2 ranks with --trace: the file is valid, and a bucket's all-reduce starts
#                             during backward (not with one flat all-reduce); Perfetto's engine where it can run;
#                             then lessons 04, 08, 09, 10 (tests/trace/run-lessons.sh: each one's own spans)
#                             (the writer's own unit test, tests/test_trace.c, runs in test-kit)
# make plot-trace TRACE=FILE  FILE.png: ranks as rows, phases by colour (tools/plot_trace.py + gnuplot); STEPS=3:
#                             three steps from the middle of the run; FROM=/TO= seconds; OUT=, TITLE=
.PHONY: test-trace plot-trace
TEST_TARGETS += test-trace
HELP_TARGETS += test-trace plot-trace
ifeq ($(HAVE_MPI),yes)
test-trace: $(foreach l,01-single-gpu 02-data-parallel 03-ddp 04-checkpoint 08-pipeline 09-zero 10-precision,$(BUILD)/solutions/$(l)/train)
	@tests/trace/run-lesson03.sh $(BUILD)/solutions/03-ddp/train
	@tests/trace/run-lessons.sh $(BUILD)
else
test-trace:
	@echo "$@: skipped: Open MPI was not found (install libopenmpi-dev + openmpi-bin: make deps)"
endif
plot-trace:
	@test -n "$(TRACE)" || { echo "usage: make plot-trace TRACE=FILE [OUT=FILE.png] [STEPS=n] [FROM=s TO=s] [TITLE=...]"; exit 2; }
	@$(PYTHON) tools/plot_trace.py "$(TRACE)" $(if $(OUT),--out "$(OUT)") $(if $(STEPS),--steps $(STEPS)) \
	  $(if $(FROM),--from $(FROM)) $(if $(TO),--to $(TO)) $(if $(TITLE),--title "$(TITLE)")
# NVTX (kit/trace.c, the CUDA build) finds an attached tool with dlopen: in libc from glibc 2.34, in libdl before.
LDLIBS += $(if $(filter-out emu,$(HAVE_CUDA)),-ldl)
