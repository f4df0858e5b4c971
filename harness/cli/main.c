/* moe2dense — one binary, many subcommands (each registers itself; see cmd.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cmd.h"

#include "base/util.h"

static void list_commands(FILE *out) {
    fprintf(out, "usage: moe2dense COMMAND [options]\n\ncommands:\n");
    for (int i = 0; i < m2d_command_count(); i++) {
        const m2d_command *c = m2d_command_at(i);
        fprintf(out, "  %-12s %s\n", c->name, c->summary);
    }
    fprintf(out, "  %-12s %s\n", "help", "list commands, or 'help COMMAND' for one");
    fprintf(out, "\n'moe2dense help COMMAND' (or 'moe2dense COMMAND --help') explains one command.\n");
}

/* `moe2dense help CMD`, `moe2dense CMD --help` and `moe2dense CMD -h`: the command's title and usage. */
static void command_help(const m2d_command *c) {
    char *usage = m2d_command_usage(c);
    printf("moe2dense %s — %s\n\n%s", c->name, c->summary, usage);
    size_t n = strlen(usage);
    if (n == 0 || usage[n - 1] != '\n') putchar('\n');
    free(usage);
}

static int help(int argc, char **argv) {
    if (argc < 3) {
        list_commands(stdout);
        return 0;
    }
    const m2d_command *c = m2d_command_find(argv[2]);
    if (!c) {
        fprintf(stderr, "moe2dense help: unknown command '%s'\n", argv[2]);
        return 2;
    }
    command_help(c);
    return 0;
}

static int is_help_flag(const char *a) { return !strcmp(a, "--help") || !strcmp(a, "-h"); }

/* Any argument after the command is --help or -h (no command takes either as a value). */
static int wants_help(int argc, char **argv) {
    for (int i = 2; i < argc; i++)
        if (is_help_flag(argv[i])) return 1;
    return 0;
}

/* What a command printed must have reached stdout (a full disk, a closed pipe): RC, or 1 with one
 * line when the flush fails. A command that already failed has said why; its status stands. */
static int stdout_checked(const char *cmd, int rc) {
    if (fflush(stdout) == 0 && !ferror(stdout)) return rc;
    if (rc == 0) fprintf(stderr, "moe2dense %s: standard output: write failed: %s\n", cmd, strerror(errno));
    return rc ? rc : 1;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        list_commands(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "help") || is_help_flag(argv[1])) return stdout_checked("help", help(argc, argv));
    if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "version")) {
        puts("moe2dense " M2D_VERSION);
        return stdout_checked("version", 0);
    }
    const m2d_command *c = m2d_command_find(argv[1]);
    if (!c) {
        fprintf(stderr, "moe2dense: unknown command '%s' (run 'moe2dense help')\n", argv[1]);
        return 2;
    }
    if (wants_help(argc, argv)) {
        command_help(c);
        return stdout_checked(c->name, 0);
    }
    return stdout_checked(c->name, c->run(argc - 1, argv + 1));
}
