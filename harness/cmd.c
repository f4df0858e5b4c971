#include "cmd.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

#define MAX_COMMANDS 64
static const m2d_command *commands[MAX_COMMANDS];
static int n_commands;

void m2d_command_register(const m2d_command *c) {
    if (n_commands == MAX_COMMANDS) {
        fprintf(stderr, "moe2dense: too many commands (raise MAX_COMMANDS)\n");
        abort();
    }
    /* insertion keeps the table sorted by name */
    int i = n_commands++;
    while (i > 0 && strcmp(commands[i - 1]->name, c->name) > 0) {
        commands[i] = commands[i - 1];
        i--;
    }
    commands[i] = c;
}

const m2d_command *m2d_command_find(const char *name) {
    for (int i = 0; i < n_commands; i++)
        if (strcmp(commands[i]->name, name) == 0) return commands[i];
    return NULL;
}

int m2d_command_count(void) { return n_commands; }
const m2d_command *m2d_command_at(int i) { return commands[i]; }

int m2d_cmd_fail(const char *cmd) {
    const char *msg = m2d_errmsg();
    size_t n = strlen(cmd);
    /* messages from the option parser already start with the command name */
    if (strncmp(msg, cmd, n) == 0 && msg[n] == ':') fprintf(stderr, "moe2dense %s\n", msg);
    else fprintf(stderr, "moe2dense %s: %s\n", cmd, msg);
    return 1;
}
