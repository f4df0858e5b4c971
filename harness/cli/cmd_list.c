/* moe2dense list — every registered scoring / grouping / scaling plugin with its one-line summary. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cmd.h"
#include "criteria/registry.h"
#include "base/util.h"

static const char *selection_of(const m2d_plugin *p) {
    if (p->kind != M2D_SCORING) return NULL;
    return p->select ? "custom" : "top-k";
}

static void print_text(int kind_filter) {
    for (int k = 0; k < M2D_PLUGIN_KINDS; k++) {
        if (kind_filter >= 0 && k != kind_filter) continue;
        printf("%s plugins:\n", m2d_plugin_kind_name((m2d_plugin_kind)k));
        for (int i = 0; i < m2d_plugin_count((m2d_plugin_kind)k); i++) {
            const m2d_plugin *p = m2d_plugin_at((m2d_plugin_kind)k, i);
            printf("  %-14s %s", p->name, p->summary ? p->summary : "");
            if (p->params_default) printf("  [params: %s]", p->params_default);
            putchar('\n');
        }
        for (int i = 0; i < m2d_plugin_factory_count((m2d_plugin_kind)k); i++) {
            const m2d_plugin_factory *f = m2d_plugin_factory_at((m2d_plugin_kind)k, i);
            printf("  %-14s %s\n", f->pattern, f->summary);
        }
        putchar('\n');
    }
}

static int print_json(int kind_filter) {
    cJSON *root = cJSON_CreateObject();
    for (int k = 0; k < M2D_PLUGIN_KINDS; k++) {
        if (kind_filter >= 0 && k != kind_filter) continue;
        cJSON *arr = cJSON_AddArrayToObject(root, m2d_plugin_kind_name((m2d_plugin_kind)k));
        for (int i = 0; i < m2d_plugin_count((m2d_plugin_kind)k); i++) {
            const m2d_plugin *p = m2d_plugin_at((m2d_plugin_kind)k, i);
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "name", p->name);
            cJSON_AddStringToObject(o, "summary", p->summary ? p->summary : "");
            if (selection_of(p)) cJSON_AddStringToObject(o, "selection", selection_of(p));
            cJSON *params = cJSON_AddObjectToObject(o, "params");
            m2d_params defaults;
            if (m2d_params_parse(p->params_default, &defaults) != 0) {
                cJSON_Delete(root);
                return -1;
            }
            for (int j = 0; j < defaults.n; j++) cJSON_AddNumberToObject(params, defaults.keys[j], defaults.values[j]);
            m2d_params_free(&defaults);
            cJSON_AddItemToArray(arr, o);
        }
    }
    char *s = cJSON_Print(root);
    puts(s);
    free(s);
    cJSON_Delete(root);
    return 0;
}

static int cmd_list_run(int argc, char **argv) {
    int json = 0, npos = 0;
    char *pos[1];
    m2d_opt opts[] = {{"--json", 0, NULL, &json}, {0}};
    if (m2d_parse_opts("list", argc, argv, opts, pos, 1, &npos) != 0) return m2d_cmd_fail("list");
    int kind = -1;
    if (npos == 1) {
        for (int k = 0; k < M2D_PLUGIN_KINDS; k++)
            if (!strcmp(pos[0], m2d_plugin_kind_name((m2d_plugin_kind)k))) kind = k;
        if (kind < 0) {
            m2d_err("list: unknown kind '%s' (scoring, grouping or scaling)", pos[0]);
            return m2d_cmd_fail("list");
        }
    }
    if (json) return print_json(kind) == 0 ? 0 : m2d_cmd_fail("list");
    print_text(kind);
    return 0;
}

M2D_COMMAND(list, "list", "list the scoring, grouping and scaling plugins",
            "usage: moe2dense list [KIND] [--json]\n"
            "\n"
            "Prints every registered plugin by kind (scoring, grouping, scaling) with a one-line\n"
            "summary and its parameters with their defaults. KIND limits the listing to one kind.\n"
            "\n"
            "Scoring plugins rank experts (top-K, ties -> lower expert index) unless they have their\n"
            "own selection; 'do-X' applies D-optimal selection to the scores of any scoring X.\n"
            "Parameters are given as key=value lists, e.g. bac with b=1,a=0,c=2 (= msan).\n"
            "\n"
            "options:\n"
            "  --json   machine-readable: {\"scoring\": [{\"name\", \"summary\", \"selection\", \"params\"}], ...}\n"
            "\n"
            "Adding a plugin: see criteria/README.md (copy a small file, change the formula, make).\n",
            cmd_list_run)
