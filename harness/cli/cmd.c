#include "cli/cmd.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "base/util.h"

#define MAX_COMMANDS 64
static const void *command_items[MAX_COMMANDS];
static m2d_name_table commands = {command_items, 0, MAX_COMMANDS, offsetof(m2d_command, name),
                                  "too many commands (raise MAX_COMMANDS)"};

void m2d_command_register(const m2d_command *c) { m2d_name_table_add(&commands, c); }
const m2d_command *m2d_command_find(const char *name) { return m2d_name_table_find(&commands, name); }
int m2d_command_count(void) { return commands.n; }
const m2d_command *m2d_command_at(int i) { return commands.items[i]; }

double m2d_cmd_peak_rss_mib(void) {
    struct rusage ru;
    return getrusage(RUSAGE_SELF, &ru) == 0 ? ru.ru_maxrss / 1024.0 : 0; /* Linux: ru_maxrss in KiB */
}

int m2d_cmd_fail(const char *cmd) {
    const char *msg = m2d_errmsg();
    size_t n = strlen(cmd);
    /* messages from the option parser already start with the command name */
    if (strncmp(msg, cmd, n) == 0 && msg[n] == ':') fprintf(stderr, "moe2dense %s\n", msg);
    else fprintf(stderr, "moe2dense %s: %s\n", cmd, msg);
    return 1;
}
