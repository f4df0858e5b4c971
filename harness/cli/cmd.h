/* cmd — subcommands register themselves; `moe2dense help` lists them. */
#ifndef M2D_CMD_H
#define M2D_CMD_H

typedef struct {
    const char *name;     /* "inspect" */
    const char *summary;  /* one line for `moe2dense help` */
    const char *usage;    /* full text for `moe2dense help NAME` */
    int (*run)(int argc, char **argv); /* argv[0] is the command name; returns exit status */
} m2d_command;

void m2d_command_register(const m2d_command *c);
const m2d_command *m2d_command_find(const char *name);
int m2d_command_count(void);
const m2d_command *m2d_command_at(int i); /* sorted by name */

/* Put at file scope in the command's .c file:
 *   M2D_COMMAND(inspect, "inspect", "one line", "usage text", cmd_inspect_run) */
#define M2D_COMMAND(ident, name_, summary_, usage_, run_)                          \
    static const m2d_command ident##_command = {name_, summary_, usage_, run_};    \
    __attribute__((constructor)) static void ident##_command_register(void) {      \
        m2d_command_register(&ident##_command);                                    \
    }

/* The MoE families a teacher may be (each an adapter, harness/model/arch_*.c), for usage texts. */
#define M2D_CMD_TEACHER_FAMILIES "Qwen3-MoE, Qwen2-MoE, Mixtral, OLMoE, DeepSeek-V2 or GPT-OSS"

/* Peak resident memory of this process so far, in MiB (getrusage), for --json outputs. */
double m2d_cmd_peak_rss_mib(void);

/* Print m2d_errmsg() as "moe2dense CMD: MSG" and return 1. */
int m2d_cmd_fail(const char *cmd);

#endif
