# moe2dense — build, test, data, demo, bench.
# Every .c under harness/ criteria/ evals/ is compiled and linked; plugins and
# subcommands register themselves, so adding a file needs no Makefile edit.

CC       ?= cc
BUILD    ?= build
DATA_DIR ?= data
DATA_MIRROR ?= ../shared/data
MODELS_DIR ?= ../shared/models

PKGS     := libcjson libpcre2-8 libutf8proc
CPPFLAGS += -Iharness -I. -I/usr/include/openblas -D_DEFAULT_SOURCE -D_FILE_OFFSET_BITS=64
CFLAGS   ?= -O2 -march=native -g
# override: a CFLAGS given on the command line (e.g. -march=x86-64-v3, bench/peer_llamacpp.sh) keeps these
override CFLAGS += -std=c11 -Wall -Wextra -Werror -pthread -fno-strict-aliasing
LDLIBS   += -lopenblas -ldnnl -lgomp -llapacke -lcjson -lcsv -lpcre2-8 -lutf8proc -lm -pthread

ifeq ($(SAN),1)
  BUILD  := build-san
  override CFLAGS := -O1 -g -fno-omit-frame-pointer -std=c11 -Wall -Wextra -Werror -pthread -fno-strict-aliasing \
            -fsanitize=address,undefined,float-cast-overflow -fno-sanitize-recover=undefined,float-cast-overflow
  LDFLAGS += -fsanitize=address,undefined,float-cast-overflow
endif

LIB_SRC  := $(sort $(wildcard harness/*/*.c criteria/*.c criteria/*/*.c evals/*.c evals/*/*.c))
LIB_SRC  := $(filter-out harness/cli/main.c,$(LIB_SRC))
LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/%.o)

# CUDA=1: the "cuda" backend (harness/*/*.cu, nvcc) in its own build folder, so the default build
# and its objects stay as they are; the default build never needs nvcc. sm_90 (H100/H200) code
# plus compute_90 PTX that newer GPUs compile at load time.
ifeq ($(CUDA),1)
  BUILD     := $(BUILD)-cuda
  CUDA_HOME ?= /usr/local/cuda
  NVCC      ?= $(CUDA_HOME)/bin/nvcc
  NVCCFLAGS ?= -O2 -g
  NVCCFLAGS += -std=c++20 -gencode arch=compute_90,code=[sm_90,compute_90] \
               -Xcompiler -Wall,-Wextra,-Werror,-fno-strict-aliasing,-pthread
  CUDA_SRC  := $(sort $(wildcard harness/*/*.cu))
  LIB_OBJ   := $(LIB_SRC:%.c=$(BUILD)/%.o) $(CUDA_SRC:%.cu=$(BUILD)/%.o)
  LDLIBS    += -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublasLt -lcudart -lstdc++
endif
TEST_SRC := $(sort $(wildcard tests/test_*.c))
# C++ tests: tests/test_cuda_kernels.cc runs kernels of the cuda backend (harness/engine/cuda_kernels.cuh:
# the tensor-core attention, calibration's Gram and reductions) on the CPU; host C++ only, no nvcc
TEST_CXX_SRC := $(sort $(wildcard tests/test_*.cc))
TEST_BIN := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%) $(TEST_CXX_SRC:tests/%.cc=$(BUILD)/tests/%)
CXXFLAGS := $(filter-out -std=c11,$(CFLAGS)) -std=c++17 -Wno-unknown-pragmas # nvcc's #pragma unroll
BENCH_SRC := $(sort $(wildcard bench/bench_*.c))
BENCH_BIN := $(BENCH_SRC:bench/%.c=$(BUILD)/bench/%)

# quiet build lines ("CC file"); V=1 shows full commands
ifneq ($(V),1)
  Q = @
  say = @echo "  $(1) $(2)"
else
  say = @:
endif

.PHONY: all deps test test-isa test-san data demo bench bench-peer plots fuzz clean help layering verify-lm-eval lm-eval-goldens verify-hf hf-goldens verify-distill distill-goldens gpu-check gpu-bundle
ifeq ($(CUDA),1)
all: $(BUILD)/moe2dense # ./moe2dense keeps pointing at the default build
else
all: moe2dense
endif

help:
	@echo "make            build ./moe2dense"
	@echo "make deps       install missing Debian packages (root) or print the apt-get line"
	@echo "make data       populate $(DATA_DIR)/ from DATA_MIRROR=$(DATA_MIRROR) or upstream"
	@echo "make test       link the data, build and run the test suite (SAN=1 for ASan+UBSan; TESTS=\"test_x ...\")"
	@echo "make test-isa   the numerical tests again with oneDNN limited to ISA=$(ISA) (DNNL_MAX_CPU_ISA)"
	@echo "make layering   check every include against its folder's allow-list (tools/layering.sh)"
	@echo "make verify-lm-eval  every MC request against lm-eval's own, live (PyPI venv)"
	@echo "make lm-eval-goldens rewrite tests/golden/lm_eval_requests.txt from lm-eval"
	@echo "make verify-hf  checkpoints, logits, routing, students against transformers, live"
	@echo "make hf-goldens rewrite tests/golden/hf/ with transformers (PyPI venv, ~6 GB)"
	@echo "make verify-distill  distillation steps against transformers + torch, live"
	@echo "make distill-goldens rewrite tests/golden/distill/ with transformers + torch"
	@echo "make demo       calibrate, sweep, report and plot the demo experiment"
	@echo "make bench      run the benchmarks (see BENCHMARKS.md)"
	@echo "make bench-peer llama.cpp's CPU backend side by side (builds it from the llama-cpp-python sdist, pip download)"
	@echo "make plots      render plots/*.gp from results/"
	@echo "make fuzz       build the libFuzzer targets (clang)"
	@echo "make CUDA=1     also build the cuda backend (nvcc, cuBLASLt) into $(BUILD)-cuda/"
	@echo "make gpu-check  on a GPU machine with the build deps: make gpu-bundle, then tools/gpu_run.sh on it"
	@echo "make gpu-bundle CUDA=1 build + libraries + test data packed for a GPU machine without them (gpu-bundle/)"

moe2dense: $(BUILD)/moe2dense
	ln -sf $(BUILD)/moe2dense $@

$(BUILD)/moe2dense: $(BUILD)/harness/cli/main.o $(LIB_OBJ)
	$(call say,LD,$@)
	$(Q)$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(call say,CC,$<)
	$(Q)$(CC) $(CPPFLAGS) $(CFLAGS) -MMD -MP -c -o $@ $<

$(BUILD)/%.o: %.cu
	@mkdir -p $(dir $@)
	$(call say,NVCC,$<)
	$(Q)$(NVCC) $(CPPFLAGS) $(NVCCFLAGS) -MMD -MP -c -o $@ $<

# test-only support code (fixtures, test models, fake backends): linked into tests and benches,
# never into the product binary
TEST_LIB_SRC := $(filter-out tests/test_%.c,$(sort $(wildcard tests/*.c)))
TEST_LIB_OBJ := $(TEST_LIB_SRC:%.c=$(BUILD)/%.o)
.SECONDARY: $(TEST_LIB_OBJ) # built by a pattern rule, but not intermediate: keep them

$(BUILD)/tests/%: tests/%.c $(LIB_OBJ) $(TEST_LIB_OBJ)
	@mkdir -p $(dir $@)
	$(call say,LD,$@)
	$(Q)$(CC) $(CPPFLAGS) -Itests $(CFLAGS) -MMD -MP $(LDFLAGS) -o $@ $< $(LIB_OBJ) $(TEST_LIB_OBJ) $(LDLIBS) -lcmocka

$(BUILD)/tests/%: tests/%.cc harness/engine/cuda_kernels.cuh harness/engine/cuda_train_kernels.cuh \
                  harness/engine/cuda_reduce.cuh tests/cuda_emu.h tests/attn_ref.h
	@mkdir -p $(dir $@)
	$(call say,CXX,$<)
	$(Q)$(CXX) $(CPPFLAGS) -Itests $(CXXFLAGS) $(LDFLAGS) -o $@ $< -lcmocka

$(BUILD)/tests/%.o: tests/%.c
	@mkdir -p $(dir $@)
	$(call say,CC,$<)
	$(Q)$(CC) $(CPPFLAGS) -Itests $(CFLAGS) -MMD -MP -c -o $@ $<

# the test-only sweep backends ("fake"; they register themselves like "pipeline")
TEST_BACKEND_OBJ := $(BUILD)/tests/sweep_fake.o

# the product CLI plus the test-only sweep backends: what the tests run where an experiment says
# backend = "fake" (the product binary has no such backend)
TEST_CLI := $(BUILD)/tests/moe2dense-test
$(TEST_CLI): $(BUILD)/harness/cli/main.o $(LIB_OBJ) $(TEST_BACKEND_OBJ)
	@mkdir -p $(dir $@)
	$(call say,LD,$@)
	$(Q)$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $^ $(LDLIBS)

BENCH_LIB_OBJ := $(BUILD)/tests/testmodel.o $(TEST_BACKEND_OBJ) $(BUILD)/bench/yardstick.o
$(BUILD)/bench/yardstick.o: bench/yardstick.c
	@mkdir -p $(dir $@)
	$(call say,CC,$<)
	$(Q)$(CC) $(CPPFLAGS) $(CFLAGS) -MMD -MP -c -o $@ $<
$(BUILD)/bench/%: bench/%.c $(LIB_OBJ) $(BENCH_LIB_OBJ)
	@mkdir -p $(dir $@)
	$(call say,LD,$@)
	$(Q)$(CC) $(CPPFLAGS) -Itests $(CFLAGS) -MMD -MP $(LDFLAGS) -o $@ $< $(LIB_OBJ) $(BENCH_LIB_OBJ) $(LDLIBS)

# `make test` prepares what the tests need by itself: the data (`make data`: links from DATA_MIRROR,
# sha256-checked, or downloads) and, in tests/run.sh (M2D_REF_SETUP=1), the references' venv.
# TESTS="test_a test_b" runs only those binaries (default: every tests/test_*.c).
TEST_RUN := $(if $(strip $(TESTS)),$(addprefix $(BUILD)/tests/,$(TESTS)),$(TEST_BIN))
test: layering data $(TEST_RUN) $(BUILD)/moe2dense $(TEST_CLI)
	@M2D_BIN=$(BUILD)/moe2dense M2D_TEST_BIN=$(TEST_CLI) M2D_DATA=$(DATA_DIR) M2D_MODELS=$(MODELS_DIR) \
	  M2D_BUILD=$(BUILD) M2D_REF_SETUP=1 sh tests/run.sh $(TEST_RUN)

# The numerical tests once more with oneDNN held to an older instruction set (DNNL_MAX_CPU_ISA,
# default AVX2: no AVX-512, no AMX): other kernels, other summation orders, the same tolerances.
# OpenBLAS keeps the core it detects. .ci/run runs it; ISA=AVX512_CORE etc. picks another level.
ISA ?= AVX2
ISA_TESTS := test_hf test_families test_engine test_calib test_convert test_prune test_gemm test_dpbf16 test_fma32 test_distill test_distill_run \
             test_gptoss test_mixtral test_train test_train_ops
# and the bf16 kernels once more without AMX: where a CPU has it, the own AVX512-BF16 kernel (never
# chosen beside AMX) and oneDNN's AVX512-BF16 kernels run against each other only this way (on a
# CPU without AVX512-BF16 the cap changes nothing)
test-isa:
	@echo "== make test TESTS=\"$(ISA_TESTS)\" under DNNL_MAX_CPU_ISA=$(ISA) =="
	@DNNL_MAX_CPU_ISA=$(ISA) $(MAKE) --no-print-directory test TESTS="$(ISA_TESTS)"
	@echo "== make test TESTS=\"test_dpbf16 test_gemm\" under DNNL_MAX_CPU_ISA=AVX512_CORE_BF16 =="
	@DNNL_MAX_CPU_ISA=AVX512_CORE_BF16 $(MAKE) --no-print-directory test TESTS="test_dpbf16 test_gemm"

layering:
	@sh tools/layering.sh

test-san:
	$(MAKE) SAN=1 test

# Live checks against the real references, installed from PyPI into git-ignored venvs by
# tests/ref/setup.sh (README, Testing). The paper's shots:
LM_EVAL_PAPER := winogrande:5 arc_challenge:25 arc_easy:25 hellaswag:10 mmlu:5
LM_EVAL_HASHES = tests/ref/.venv/bin/python tests/ref/lm_eval_requests.py --hashes --jobs 2 $(DATA_DIR) $(LM_EVAL_PAPER)

lm-eval-goldens:
	@sh tests/ref/setup.sh light
	$(LM_EVAL_HASHES) > tests/golden/lm_eval_requests.txt.tmp && mv tests/golden/lm_eval_requests.txt.tmp tests/golden/lm_eval_requests.txt

verify-lm-eval: $(BUILD)/tests/test_mc
	@sh tests/ref/setup.sh light
	$(LM_EVAL_HASHES) > $(BUILD)/lm_eval_requests.txt
	M2D_DATA=$(DATA_DIR) M2D_LM_EVAL_GOLDEN=$(BUILD)/lm_eval_requests.txt M2D_LM_EVAL_LIVE=1 \
	  sh tests/run.sh $(BUILD)/tests/test_mc
	@cmp -s $(BUILD)/lm_eval_requests.txt tests/golden/lm_eval_requests.txt || \
	  { echo "verify-lm-eval: tests/golden/lm_eval_requests.txt is not what lm-eval builds now: make lm-eval-goldens"; exit 1; }

HF_PY := tests/ref/.venv-hf/bin/python

# the families' goldens are made by one script each (tools/hf_goldens*.py), checked by their tests
HF_GOLDEN_TESTS := $(BUILD)/tests/test_hf $(BUILD)/tests/test_mixtral $(BUILD)/tests/test_gptoss

hf-goldens: $(BUILD)/moe2dense
	@sh tests/ref/setup.sh hf
	$(HF_PY) tools/hf_goldens.py --bin $(BUILD)/moe2dense --out tests/golden/hf
	$(HF_PY) tools/hf_goldens_families.py --bin $(BUILD)/moe2dense --out tests/golden/hf

verify-hf: $(BUILD)/moe2dense $(HF_GOLDEN_TESTS)
	@sh tests/ref/setup.sh hf
	@rm -rf $(BUILD)/hf-goldens
	$(HF_PY) tools/hf_goldens.py --bin $(BUILD)/moe2dense --out $(BUILD)/hf-goldens
	$(HF_PY) tools/hf_goldens_families.py --bin $(BUILD)/moe2dense --out $(BUILD)/hf-goldens
	M2D_BIN=$(BUILD)/moe2dense M2D_HF_GOLDEN=$(BUILD)/hf-goldens sh tests/run.sh $(HF_GOLDEN_TESTS)
	$(HF_PY) tools/hf_goldens.py --compare $(BUILD)/hf-goldens tests/golden/hf
	$(HF_PY) tools/hf_goldens_families.py --compare $(BUILD)/hf-goldens tests/golden/hf

# the distillation steps against transformers + torch (tools/distill_ref.py)
distill-goldens:
	@sh tests/ref/setup.sh hf
	$(HF_PY) tools/distill_ref.py --out tests/golden/distill

verify-distill: $(BUILD)/tests/test_distill
	@sh tests/ref/setup.sh hf
	@rm -rf $(BUILD)/distill-goldens
	$(HF_PY) tools/distill_ref.py --out $(BUILD)/distill-goldens
	M2D_DISTILL_GOLDEN=$(BUILD)/distill-goldens sh tests/run.sh $(BUILD)/tests/test_distill
	$(HF_PY) tools/distill_ref.py --compare $(BUILD)/distill-goldens tests/golden/distill

deps:
	@sh tools/deps.sh

data:
	@sh tools/data.sh "$(DATA_MIRROR)" "$(DATA_DIR)"

demo: all data
	@sh tools/demo.sh

bench: all $(BENCH_BIN)
	@sh bench/run.sh $(BUILD)

# issue 13's peer: llama.cpp built from the pinned llama-cpp-python sdist into $(BUILD)/peer (git-ignored),
# the 30B-shaped slices converted to GGUF bf16 in /tmp/m2d-peer; not part of `make bench`
bench-peer: all $(BUILD)/bench/bench_engine $(BUILD)/bench/bench_gemm data
	@BUILD=$(BUILD) sh bench/peer_llamacpp.sh run

plots:
	@sh tools/plots.sh

fuzz:
	@sh fuzz/build.sh

gpu-check:
	@sh tools/gpu_check.sh

# the GPU checks for a machine that has a GPU but none of the build dependencies (the lent H100/H200):
# built here, run there with `sh tools/gpu_run.sh gpu-bundle/bundle.tar.xz` (README, GPU)
gpu-bundle:
	@sh tools/gpu_bundle.sh

clean:
	rm -rf build build-san build-cuda build-san-cuda moe2dense

-include $(LIB_OBJ:.o=.d) $(TEST_LIB_OBJ:.o=.d) $(BUILD)/harness/cli/main.d
# the test and bench binaries compile their own .c in the link step (-MMD: test_x.d beside them)
-include $(wildcard $(BUILD)/tests/*.d $(BUILD)/bench/*.d)
