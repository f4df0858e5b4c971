/* cmd — subcommands register themselves; `moe2dense help` lists them. */
#ifndef M2D_CMD_H
#define M2D_CMD_H

#include "engine/engine.h"

typedef struct {
    const char *name;     /* "inspect" */
    const char *summary;  /* one line for `moe2dense help` */
    const char *usage;    /* full text for `moe2dense help NAME`; NULL when build_usage gives it */
    int (*run)(int argc, char **argv); /* argv[0] is the command name; returns exit status */
    /* optional: builds the usage text at run time (malloc'd), for texts that list what a registry
     * holds (tasks, teacher families); `moe2dense help NAME` prints it instead of usage */
    char *(*build_usage)(void);
} m2d_command;

void m2d_command_register(const m2d_command *c);
const m2d_command *m2d_command_find(const char *name);
int m2d_command_count(void);
const m2d_command *m2d_command_at(int i); /* sorted by name */

/* Put at file scope in the command's .c file:
 *   M2D_COMMAND(inspect, "inspect", "one line", "usage text", cmd_inspect_run) */
#define M2D_COMMAND(ident, name_, summary_, usage_, run_)                          \
    static const m2d_command ident##_command = {name_, summary_, usage_, run_, NULL}; \
    __attribute__((constructor)) static void ident##_command_register(void) {      \
        m2d_command_register(&ident##_command);                                    \
    }

/* The same with a usage text built at run time by build_ (char *build_(void), malloc'd):
 *   M2D_COMMAND_BUILT(eval, "eval", "one line", eval_usage, cmd_eval_run) */
#define M2D_COMMAND_BUILT(ident, name_, summary_, build_, run_)                    \
    static const m2d_command ident##_command = {name_, summary_, NULL, run_, build_}; \
    __attribute__((constructor)) static void ident##_command_register(void) {      \
        m2d_command_register(&ident##_command);                                    \
    }

/* The usage text of C (malloc'd): build_usage's, else a copy of usage. */
char *m2d_command_usage(const m2d_command *c);

/* The MoE families a teacher may be, for usage texts: the .family of every registered
 * architecture adapter that has one (harness/model/arch_*.c), "A, B, ... or F". */
const char *m2d_cmd_teacher_families(void);
/* In a usage text, where the families go: string literal pieces around it, e.g.
 *   "  --model DIR  a MoE checkpoint (" M2D_CMD_TEACHER_FAMILIES ")\n" */
#define M2D_CMD_TEACHER_FAMILIES "{teacher families}"
/* USAGE with every M2D_CMD_TEACHER_FAMILIES replaced by m2d_cmd_teacher_families() (malloc'd);
 * a command's build_usage: static char *usage(void) { return m2d_cmd_usage_families(USAGE); } */
char *m2d_cmd_usage_families(const char *usage);

/* FIRST followed by the words of TEXT, wrapped at WIDTH columns with continuation lines
 * indented by INDENT spaces, ending with a newline (malloc'd): an option's description. */
char *m2d_cmd_wrap(const char *first, const char *text, int indent, int width);

/* Peak resident memory of this process so far, in MiB (getrusage), for --json outputs. */
double m2d_cmd_peak_rss_mib(void);

/* The options of a pass over many windows (engine.h m2d_pass_opts): --pass auto|window|layer and
 * --mem-budget BYTES of CMD (either NULL: auto, 80 % of RAM) into *MODE and *BUDGET (bytes). */
#define M2D_CMD_PASS_USAGE                                                                               \
    "  --pass P       auto (default): layer-major when the model's weights exceed --mem-budget, else\n"  \
    "                 window-major; layer: every window through one layer at a time, so each layer's\n"  \
    "                 weights are read from disk once per pass (a checkpoint larger than RAM);\n"       \
    "                 window: each window through every layer. Same results either way\n"             \
    "  --mem-budget B bytes the pass may hold, e.g. 20G (default 80 % of RAM): layer-major keeps one\n" \
    "                 layer and the activations of all windows; beyond it, groups of windows\n"      \
    "                 (the weights read once a group) or a spill file, whichever moves fewer bytes\n"
int m2d_cmd_pass_args(const char *cmd, const char *pass_s, const char *budget_s, m2d_pass_mode *mode, size_t *budget);

/* --attention fp32|bf16 (m2d_engine_opts.attention) of the commands that evaluate */
#define M2D_CMD_ATTENTION_USAGE                                                                          \
    "  --attention A  precision of attention's operands, whatever --precision: fp32 (default;\n"        \
    "                 exact) or bf16 (q, k, v and the softmax's numerators rounded to bf16, fp32\n"       \
    "                 sums: transformers' bf16 SDPA; faster where bf16 outruns fp32, e.g. AMX, GPUs).\n" \
    "                 Recorded in the output; a device without it refuses\n"
/* Parse CMD's --attention value S (NULL: fp32) into *OUT; one line naming CMD otherwise. */
int m2d_cmd_attention_arg(const char *cmd, const char *s, m2d_precision *out);
/* One line on stderr saying how CMD's pass over M runs (which order, why, and where the
 * activations of TOKENS tokens go; TOKENS <= 0: not known yet). */
void m2d_cmd_print_pass(const char *cmd, const m2d_model *m, m2d_pass_mode mode, size_t budget, int64_t tokens);

/* Print m2d_errmsg() as "moe2dense CMD: MSG" and return 1. */
int m2d_cmd_fail(const char *cmd);

#endif
