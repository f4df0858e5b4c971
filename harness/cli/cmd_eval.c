/* eval — lm-eval-style multiple-choice evaluation of a model (evals/mc.h). */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cmd.h"
#include "engine/engine.h"
#include "evals/lm.h"
#include "evals/mc.h"
#include "base/util.h"

/* the scores, as text or JSON, with the precision used and the device */
static void print_results(const m2d_mc_results *res, int json, m2d_precision used, m2d_precision prec,
                          m2d_precision attn, const char *device, double t0) {
    if (json) {
        char *s = m2d_mc_results_json(res);
        cJSON *o = cJSON_Parse(s);
        free(s);
        cJSON_AddStringToObject(o, "precision", m2d_precision_name(used));
        cJSON_AddStringToObject(o, "precision_requested", m2d_precision_name(prec));
        cJSON_AddStringToObject(o, "attention", m2d_precision_name(attn));
        cJSON_AddStringToObject(o, "device", device);
        cJSON_AddNumberToObject(o, "peak_rss_mib", m2d_cmd_peak_rss_mib());
        s = cJSON_Print(o);
        puts(s);
        free(s);
        cJSON_Delete(o);
    } else {
        printf("precision %s (requested %s)\nattention %s\ndevice %s\n", m2d_precision_name(used), m2d_precision_name(prec),
               m2d_precision_name(attn), device);
        m2d_mc_results_print(res, stdout);
        fprintf(stdout, "%lld requests in %.1f s\n", (long long)res->n_requests, m2d_now() - t0);
    }
}

static int cmd_eval_run(int argc, char **argv) {
    const char *model = NULL, *tasks = NULL, *shots_s = NULL, *limit_s = NULL, *dump = NULL, *data = NULL;
    const char *threads_s = NULL, *seed_s = NULL, *maxlen_s = NULL, *prec_s = "fp32", *device = "cpu";
    const char *pass_s = NULL, *budget_s = NULL, *attn_s = NULL;
    int json = 0, naive = 0;
    m2d_opt opts[] = {
        {"--model", 1, &model, NULL},       {"--tasks", 1, &tasks, NULL},
        {"--shots", 1, &shots_s, NULL},     {"--limit", 1, &limit_s, NULL},
        {"--json", 0, NULL, &json},         {"--dump-requests", 1, &dump, NULL},
        {"--data", 1, &data, NULL},         {"--threads", 1, &threads_s, NULL},
        {"--seed", 1, &seed_s, NULL},       {"--max-length", 1, &maxlen_s, NULL},
        {"--naive", 0, NULL, &naive},       {"--precision", 1, &prec_s, NULL},
        {"--device", 1, &device, NULL},     {"--pass", 1, &pass_s, NULL},
        {"--mem-budget", 1, &budget_s, NULL}, {"--attention", 1, &attn_s, NULL},
        {0},
    };
    int npos = 0;
    if (m2d_parse_opts("eval", argc, argv, opts, NULL, 0, &npos)) return m2d_cmd_fail("eval");
    if (!model) { m2d_err("eval: --model DIR is required"); return m2d_cmd_fail("eval"); }
    if (!tasks) { m2d_err("eval: --tasks LIST is required (e.g. --tasks all)"); return m2d_cmd_fail("eval"); }
    long shots = 0, limit = 0, threads = 0, seed = 1234, maxlen = 0;
    if (shots_s && strcmp(shots_s, "paper") == 0) shots = M2D_MC_SHOTS_PAPER;
    else if (shots_s && m2d_parse_int("eval", "--shots", shots_s, 0, 1000, &shots)) return m2d_cmd_fail("eval");
    if (limit_s && m2d_parse_int("eval", "--limit", limit_s, 1, 1L << 30, &limit)) return m2d_cmd_fail("eval");
    if (threads_s && m2d_parse_int("eval", "--threads", threads_s, 1, 1024, &threads)) return m2d_cmd_fail("eval");
    if (seed_s && m2d_parse_int("eval", "--seed", seed_s, -(1L << 62), 1L << 62, &seed)) return m2d_cmd_fail("eval");
    if (maxlen_s && m2d_parse_int("eval", "--max-length", maxlen_s, 2, 1L << 30, &maxlen)) return m2d_cmd_fail("eval");

    m2d_precision prec, attn;
    m2d_pass_mode pass;
    size_t budget;
    if (m2d_precision_parse(prec_s, "eval: --precision", &prec) || m2d_device_check(device, "eval: --device") ||
        m2d_cmd_attention_arg("eval", attn_s, &attn) ||
        m2d_cmd_pass_args("eval", pass_s, budget_s, &pass, &budget))
        return m2d_cmd_fail("eval");

    m2d_lm *lm = NULL;
    m2d_engine_opts eo = {.backend = device, .n_threads = threads ? (int)threads : m2d_default_threads(), .precision = prec,
                          .pass = pass, .mem_budget = budget, .attention = attn};
    if (m2d_lm_engine_open(model, &eo, naive ? M2D_LM_NAIVE : M2D_LM_CACHED, (int)maxlen, &lm))
        return m2d_cmd_fail("eval");
    if (!json) m2d_cmd_print_pass("eval", m2d_engine_model(m2d_lm_engine_of(lm)), pass, budget, 0);
    m2d_precision used = m2d_engine_precision(m2d_lm_engine_of(lm));
    m2d_mc_config cfg;
    m2d_mc_config_default(&cfg);
    if (data) cfg.data_dir = data;
    cfg.dump_requests = dump;
    cfg.seed = seed;
    cfg.progress = 1;
    m2d_mc_results res;
    double t0 = m2d_now();
    int rc = m2d_mc_run(lm, tasks, (int)shots, (int)limit, &cfg, &res);
    m2d_lm_free(lm);
    if (rc) return m2d_cmd_fail("eval");
    print_results(&res, json, used, prec, attn, device, t0);
    m2d_mc_results_free(&res);
    return 0;
}

/* The usage around the lines built from the task registry (--tasks, --shots paper). */
static const char USAGE_HEAD[] =
    "usage: moe2dense eval --model DIR --tasks LIST [options]\n"
    "\n"
    "Scores multiple-choice tasks exactly as lm-evaluation-harness builds them\n"
    "(data/LM_EVAL_TASKS.md): prompts, few-shot sampling (Python random.Random(seed).sample),\n"
    "log-likelihood requests, acc / acc_norm with lm-eval's standard errors.\n"
    "\n"
    "  --model DIR          model directory (config.json, *.safetensors, tokenizer.json)\n";
static const char USAGE_TAIL[] =
    "  --limit N            evaluate only the first N documents of each task (per subject for\n"
    "                       MMLU); few-shot pools stay whole\n"
    "  --json               print results as JSON (per task, MMLU subjects and groups, deviations)\n"
    "  --dump-requests FILE write every scored request as a JSON line {task, doc, choice,\n"
    "                       context, continuation} (exact strings, before tokenization)\n"
    "  --data DIR           dataset folder (default data; populate with `make data`)\n"
    "  --seed N             few-shot random seed (default 1234, lm-eval's fewshot_random_seed)\n"
    "  --max-length N       truncate inputs on the left to N tokens (default and cap: the\n"
    "                       model's max_position_embeddings)\n"
    "  --threads N          threads (default $M2D_THREADS or all cores)\n"
    "  --precision P        GEMM precision: fp32 (default; exact), bf16 (operands rounded to bf16,\n"
    "                       fp32 accumulation) or auto (bf16 where the CPU computes it natively);\n"
    "                       the output records the one used\n"
    "  --device D           where the engine runs: cpu (default), cuda or cuda:N (a `make CUDA=1`\n"
    "                       build and a GPU; an absent device is an error, never a CPU run)\n"
    "  --attention A        as ppl's: fp32 (default; exact) or bf16 attention operands\n"
    "  --pass P, --mem-budget B   as ppl's: layer-major (a model larger than --mem-budget) scores every\n"
    "                       request in one pass over all of them, each its own window (no shared\n"
    "                       prefix): the model is read once, not once a question\n"
    "  --naive              one full forward per request instead of the shared-prefix KV cache\n"
    "                       (slower; also computes is_greedy)\n"
    "\n"
    "Output: per task acc and acc_norm (where the task defines it) with standard errors\n"
    "(sample std / sqrt(n); MMLU groups micro-averaged with lm-eval's pooled stderr), and the\n"
    "paper-style average (winogrande acc, hellaswag acc_norm, arc_easy acc_norm,\n"
    "arc_challenge acc_norm, mmlu acc) when all five tasks ran. Every deviation from lm-eval\n"
    "forced by the data available (HellaSwag text variant, Winogrande train_l) is printed next\n"
    "to the scores and stored in the JSON.\n";

/* --tasks and --shots from the registered task plugins (evals/tasks/), so a new task is listed. */
static char *eval_usage(void) {
    char *tasks = m2d_strdup("comma-separated:"), *shots = m2d_strdup("few-shot examples per prompt (default 0); paper =");
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < m2d_mc_plugin_count(); i++) {
            const m2d_mc_plugin *p = m2d_mc_plugin_at(i);
            char *t = tasks;
            if (pass == 0) tasks = m2d_strfmt("%s %s,", t, p->name);
            else if (p->n_subtasks > 1) tasks = m2d_strfmt("%s %s_<subtask> (one of its %d),", t, p->name, p->n_subtasks);
            else continue;
            free(t);
            if (pass == 0) {
                char *s = shots;
                shots = m2d_strfmt("%s %s %d%s", s, p->name, p->paper_shots, i + 1 < m2d_mc_plugin_count() ? "," : "");
                free(s);
            }
        }
    char *t = tasks;
    tasks = m2d_strfmt("%s or all (the five tasks of the paper average)", t);
    free(t);
    char *tl = m2d_cmd_wrap("  --tasks LIST         ", tasks, 23, 96);
    char *sl = m2d_cmd_wrap("  --shots N|paper      ", shots, 23, 96);
    char *out = m2d_strfmt("%s%s%s%s", USAGE_HEAD, tl, sl, USAGE_TAIL);
    free(tasks);
    free(shots);
    free(tl);
    free(sl);
    return out;
}

M2D_COMMAND_BUILT(eval, "eval", "multiple-choice evaluation (ARC-E/C, HellaSwag, Winogrande, MMLU) the lm-eval way",
                  eval_usage, cmd_eval_run)
