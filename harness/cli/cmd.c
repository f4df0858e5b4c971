#include "cli/cmd.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "base/util.h"
#include "model/model.h"

#define MAX_COMMANDS 64
static const void *command_items[MAX_COMMANDS];
static m2d_name_table commands = {command_items, 0, MAX_COMMANDS, offsetof(m2d_command, name),
                                  "too many commands (raise MAX_COMMANDS)"};

void m2d_command_register(const m2d_command *c) { m2d_name_table_add(&commands, c); }
const m2d_command *m2d_command_find(const char *name) { return m2d_name_table_find(&commands, name); }
int m2d_command_count(void) { return commands.n; }
const m2d_command *m2d_command_at(int i) { return commands.items[i]; }

char *m2d_command_usage(const m2d_command *c) {
    return c->build_usage ? c->build_usage() : m2d_strdup(c->usage ? c->usage : "");
}

const char *m2d_cmd_teacher_families(void) {
    static char buf[512];
    int n = 0, k = 0;
    for (int i = 0; i < m2d_arch_count(); i++) n += m2d_arch_at(i)->family != NULL;
    buf[0] = '\0';
    for (int i = 0; i < m2d_arch_count(); i++) {
        const char *f = m2d_arch_at(i)->family;
        if (!f) continue;
        size_t len = strlen(buf);
        snprintf(buf + len, sizeof buf - len, "%s%s", k == 0 ? "" : k == n - 1 ? " or " : ", ", f);
        k++;
    }
    return buf;
}

char *m2d_cmd_usage_families(const char *usage) {
    const char *mark = M2D_CMD_TEACHER_FAMILIES, *fam = m2d_cmd_teacher_families();
    size_t nm = strlen(mark), nf = strlen(fam), n = 0;
    for (const char *p = strstr(usage, mark); p; p = strstr(p + nm, mark)) n++;
    char *out = m2d_malloc(strlen(usage) + n * nf + 1), *o = out;
    for (const char *p = usage, *q; *p; p = q + nm) {
        q = strstr(p, mark);
        size_t k = q ? (size_t)(q - p) : strlen(p);
        memcpy(o, p, k);
        o += k;
        if (!q) break;
        memcpy(o, fam, nf);
        o += nf;
    }
    *o = '\0';
    return out;
}

char *m2d_cmd_wrap(const char *first, const char *text, int indent, int width) {
    size_t cap = strlen(first) + strlen(text) * 2 + 64, len = 0;
    char *out = m2d_malloc(cap);
    len = (size_t)snprintf(out, cap, "%s", first);
    int col = (int)len, at_start = 1;
    for (const char *p = text; *p;) {
        while (*p == ' ') p++;
        if (!*p) break;
        size_t w = strcspn(p, " ");
        if (cap < len + w + (size_t)indent + 4) out = m2d_realloc(out, cap = (len + w + (size_t)indent + 4) * 2);
        if (!at_start && col + 1 + (int)w > width) {
            len += (size_t)sprintf(out + len, "\n%*s", indent, "");
            col = indent;
            at_start = 1;
        }
        if (!at_start) { out[len++] = ' '; col++; }
        memcpy(out + len, p, w);
        len += w;
        col += (int)w;
        at_start = 0;
        p += w;
    }
    out[len++] = '\n';
    out[len] = '\0';
    return out;
}

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
