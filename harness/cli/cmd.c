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

int m2d_cmd_pass_args(const char *cmd, const char *pass_s, const char *budget_s, m2d_pass_mode *mode, size_t *budget) {
    char what[64];
    snprintf(what, sizeof what, "%s: --pass", cmd);
    *mode = M2D_PASS_AUTO, *budget = 0;
    if (pass_s && m2d_pass_mode_parse(what, pass_s, mode)) return -1;
    if (budget_s && m2d_parse_bytes(cmd, "--mem-budget", budget_s, budget)) return -1;
    if (budget_s && *budget == 0) return m2d_err("%s: option --mem-budget: must be positive", cmd);
    return 0;
}

int m2d_cmd_attention_arg(const char *cmd, const char *s, m2d_precision *out) {
    *out = M2D_PREC_FP32;
    if (!s || strcmp(s, "fp32") == 0) return 0;
    if (strcmp(s, "bf16") == 0) return *out = M2D_PREC_BF16, 0;
    return m2d_err("%s: option --attention: '%s' is not fp32 or bf16", cmd, s);
}

void m2d_cmd_print_pass(const char *cmd, const m2d_model *m, m2d_pass_mode mode, size_t budget, int64_t tokens) {
    const double G = 1024.0 * 1024 * 1024;
    if (!budget) budget = m2d_default_mem_budget();
    m2d_pass_opts o = m2d_engine_plan_pass(m, budget, mode);
    double wb = (double)m2d_engine_weight_bytes(m) / G, acts = (double)tokens * m->cfg.hidden_size * 4 / G;
    if (!o.layer_major) {
        fprintf(stderr, "moe2dense %s: window-major pass (weights %.2f GiB, budget %.2f GiB%s)\n", cmd, wb, budget / G,
                mode == M2D_PASS_WINDOW ? ", as asked" : "");
        return;
    }
    char where[128] = "";
    if (tokens > 0)
        snprintf(where, sizeof where, "; activations %.2f GiB %s", acts,
                 acts * G <= (double)o.act_budget ? "in memory" : "over the budget: in groups of windows or spilled");
    fprintf(stderr, "moe2dense %s: layer-major pass (weights %.2f GiB, budget %.2f GiB%s): each layer's weights read "
            "once%s\n", cmd, wb, budget / G, mode == M2D_PASS_LAYER ? ", as asked" : "", where);
}
