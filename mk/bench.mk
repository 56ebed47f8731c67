# mk/bench.mk: the CPU training benchmark against PyTorch (bench/README.md).
#
#   make bench-cpu   kit vs PyTorch on the CPU, resnet9 + fmnist at batch 128 -> bench/results-cpu.md
#
BENCH_CPU := $(BUILD)/bench/bench_cpu
BENCH_CPU_ARGS ?=

# Explicit rule: it needs neither MPI nor CUDA of its own (libkit.a brings what the kit was built with).
$(BENCH_CPU): bench/bench_cpu.c $(KIT_LIB)
	@mkdir -p $(dir $@)
	$(say) LINK $@
	$(Q)$(CC) $(CPPFLAGS) $(CFLAGS) $< -o $@ $(LDFLAGS) $(KIT_LIB) $(LDLIBS)

.PHONY: bench-cpu
ALL_TARGETS += $(BENCH_CPU)
HELP_TARGETS += bench-cpu

bench-cpu: $(BENCH_CPU)
	@python3 -c "import torch" 2>/dev/null || { echo "bench-cpu: needs PyTorch (CPU) in python3: pip install torch"; exit 1; }
	python3 bench/torch_cpu.py --kit-bin $(BENCH_CPU) --out bench/results-cpu.md $(BENCH_CPU_ARGS)
	@cat bench/results-cpu.md
