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
CFLAGS   += -std=c11 -Wall -Wextra -Werror -pthread -fno-strict-aliasing
LDLIBS   += -lopenblas -ldnnl -lgomp -llapacke -lcjson -lcsv -lpcre2-8 -lutf8proc -lm -pthread

ifeq ($(SAN),1)
  BUILD  := build-san
  CFLAGS := -O1 -g -fno-omit-frame-pointer -std=c11 -Wall -Wextra -Werror -pthread -fno-strict-aliasing \
            -fsanitize=address,undefined -fno-sanitize-recover=undefined
  LDFLAGS += -fsanitize=address,undefined
endif

LIB_SRC  := $(sort $(wildcard harness/*/*.c criteria/*.c criteria/*/*.c evals/*.c evals/*/*.c))
LIB_SRC  := $(filter-out harness/cli/main.c,$(LIB_SRC))
LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/%.o)
TEST_SRC := $(sort $(wildcard tests/test_*.c))
TEST_BIN := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)
BENCH_SRC := $(sort $(wildcard bench/bench_*.c))
BENCH_BIN := $(BENCH_SRC:bench/%.c=$(BUILD)/bench/%)

# quiet build lines ("CC file"); V=1 shows full commands
ifneq ($(V),1)
  Q = @
  say = @echo "  $(1) $(2)"
else
  say = @:
endif

.PHONY: all deps test test-san data demo bench plots fuzz clean help layering
all: moe2dense

help:
	@echo "make            build ./moe2dense"
	@echo "make deps       install missing Debian packages (root) or print the apt-get line"
	@echo "make data       populate $(DATA_DIR)/ from DATA_MIRROR=$(DATA_MIRROR) or upstream"
	@echo "make test       build and run the test suite (SAN=1 for ASan+UBSan)"
	@echo "make layering   check that every include goes to its own layer or a lower one"
	@echo "make demo       calibrate, sweep, report and plot the demo experiment"
	@echo "make bench      run the benchmarks (see BENCHMARKS.md)"
	@echo "make plots      render plots/*.gp from results/"
	@echo "make fuzz       build the libFuzzer targets (clang)"

moe2dense: $(BUILD)/moe2dense
	ln -sf $(BUILD)/moe2dense $@

$(BUILD)/moe2dense: $(BUILD)/harness/cli/main.o $(LIB_OBJ)
	$(call say,LD,$@)
	$(Q)$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(call say,CC,$<)
	$(Q)$(CC) $(CPPFLAGS) $(CFLAGS) -MMD -MP -c -o $@ $<

# test-only support code (fixtures, test models, fake backends): linked into tests and benches,
# never into the product binary
TEST_LIB_SRC := $(filter-out tests/test_%.c,$(sort $(wildcard tests/*.c)))
TEST_LIB_OBJ := $(TEST_LIB_SRC:%.c=$(BUILD)/%.o)

$(BUILD)/tests/%: tests/%.c $(LIB_OBJ) $(TEST_LIB_OBJ)
	@mkdir -p $(dir $@)
	$(call say,LD,$@)
	$(Q)$(CC) $(CPPFLAGS) -Itests $(CFLAGS) $(LDFLAGS) -o $@ $< $(LIB_OBJ) $(TEST_LIB_OBJ) $(LDLIBS) -lcmocka

$(BUILD)/tests/%.o: tests/%.c
	@mkdir -p $(dir $@)
	$(call say,CC,$<)
	$(Q)$(CC) $(CPPFLAGS) -Itests $(CFLAGS) -MMD -MP -c -o $@ $<

$(BUILD)/bench/%: bench/%.c $(LIB_OBJ) $(BUILD)/tests/testmodel.o
	@mkdir -p $(dir $@)
	$(call say,LD,$@)
	$(Q)$(CC) $(CPPFLAGS) -Itests $(CFLAGS) $(LDFLAGS) -o $@ $< $(LIB_OBJ) $(BUILD)/tests/testmodel.o $(LDLIBS)

test: layering $(TEST_BIN) $(BUILD)/moe2dense
	@M2D_BIN=$(BUILD)/moe2dense M2D_DATA=$(DATA_DIR) M2D_MODELS=$(MODELS_DIR) M2D_BUILD=$(BUILD) \
	  sh tests/run.sh $(TEST_BIN)

layering:
	@sh tools/layering.sh

test-san:
	$(MAKE) SAN=1 test

deps:
	@sh tools/deps.sh

data:
	@sh tools/data.sh "$(DATA_MIRROR)" "$(DATA_DIR)"

demo: all data
	@sh tools/demo.sh

bench: all $(BENCH_BIN)
	@sh bench/run.sh $(BUILD)

plots:
	@sh tools/plots.sh

fuzz:
	@sh fuzz/build.sh

clean:
	rm -rf build build-san moe2dense

-include $(LIB_OBJ:.o=.d) $(TEST_LIB_OBJ:.o=.d) $(BUILD)/harness/cli/main.d
