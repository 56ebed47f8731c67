# mk/kit.mk: the kit library and its unit tests.
#
# kit/*.c           -> $(BUILD)/kit/*.o         (always)
# kit/cuda/*.cu     -> $(BUILD)/kit/cuda/*.o    (when CUDA + cuBLAS are found)
# tests/test_*.c    -> $(BUILD)/tests/test_*    (cmocka; each test file is one binary)

KIT_C := $(wildcard kit/*.c)
KIT_CU := $(if $(HAVE_CUDA),$(wildcard kit/cuda/*.cu))
KIT_OBJ := $(KIT_C:%.c=$(BUILD)/%.o) $(KIT_CU:%.cu=$(BUILD)/%.o)
KIT_LIB := $(BUILD)/libkit.a
KIT_HEADERS := $(wildcard kit/*.h kit/cuda/*.h)

$(BUILD)/kit/%.o: kit/%.c $(KIT_HEADERS)
	@mkdir -p $(dir $@)
	$(say) CC $<
	$(Q)$(CC) $(CPPFLAGS) $(CFLAGS) -c $< -o $@

$(BUILD)/kit/cuda/%.o: kit/cuda/%.cu $(KIT_HEADERS)
	@mkdir -p $(dir $@)
	$(say) NVCC $<
	$(Q)$(NVCC) $(NVCCFLAGS) -DKIT_CUDA -c $< -o $@

$(KIT_LIB): $(KIT_OBJ)
	@rm -f $@
	$(say) AR $@
	$(Q)ar rcs $@ $^

# Unit tests of the kit: one cmocka binary per tests/test_*.c.
KIT_TEST_SRC := $(filter-out tests/test_cuda.c,$(wildcard tests/test_*.c))  # test_cuda: mk/cuda.mk
KIT_TESTS := $(KIT_TEST_SRC:tests/%.c=$(BUILD)/tests/%)

$(BUILD)/tests/%: tests/%.c tests/testutil.h $(KIT_LIB)
	@mkdir -p $(dir $@)
	$(say) LINK $@
	$(Q)$(CC) $(CPPFLAGS) $(CMOCKA_CFLAGS) $(CFLAGS) $< -o $@ $(LDFLAGS) $(KIT_LIB) $(CMOCKA_LIBS) $(LDLIBS)

ALL_TARGETS += $(KIT_LIB) $(KIT_TESTS)
TEST_TARGETS += test-kit
HELP_TARGETS += test-kit deps

.PHONY: kit test-kit deps
kit: $(KIT_LIB)

# Runs every kit test binary, each with a time limit; stops at the first failure.
test-kit: $(KIT_TESTS)
	@tests/run-tests.sh $(KIT_TESTS)

deps:
	scripts/install-deps.sh
