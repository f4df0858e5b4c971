/* moe2dense ppl — WikiText-2 perplexity of a checkpoint (SPEC §5). */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cmd.h"
#include "engine/engine.h"
#include "model/model.h"
#include "evals/ppl.h"
#include "tokenizer/tokenizer.h"
#include "base/util.h"

static const char ppl_usage[] =
    "usage: moe2dense ppl --model DIR --data FILE [--protocol gptq|lm-eval] [--seq-len L]\n"
    "                     [--max-windows N] [--threads N] [--precision P] [--device cpu|cuda[:N]]\n"
    "                     [--attention fp32|bf16] [--pass auto|window|layer] [--mem-budget BYTES] [--json]\n"
    "\n"
    "Perplexity of the checkpoint in DIR (config.json, *.safetensors, tokenizer.json) on a raw\n"
    "WikiText file (e.g. data/wikitext-2-raw/wikitext-2-raw/wiki.test.raw).\n"
    "\n"
    "  --protocol gptq     (default) rows joined with \"\\n\\n\", encoded without BOS, floor(n/L)\n"
    "                      non-overlapping windows of L tokens; tokens 1..L-1 of each window are\n"
    "                      scored; prints ppl = exp(mean NLL). L defaults to 2048, capped by the\n"
    "                      model's max_position_embeddings.\n"
    "  --protocol lm-eval  lm-evaluation-harness `wikitext`: document split, wikitext detokenizer,\n"
    "                      rolling windows (prefix BOS, else EOS) of L = max_position_embeddings;\n"
    "                      prints word_perplexity, byte_perplexity, bits_per_byte.\n"
    "  --seq-len L         window length (must not exceed max_position_embeddings)\n"
    "  --max-windows N     stop after N windows (lm-eval: after the last whole document that fits;\n"
    "                      an error when even the first document needs more)\n"
    "  --threads N         compute threads (default $M2D_THREADS or all CPUs)\n"
    "  --precision P       GEMM precision: fp32 (default; exact), bf16 (operands rounded to bf16,\n"
    "                      fp32 accumulation) or auto (bf16 where the CPU computes it natively:\n"
    "                      AVX512-BF16 or AMX; else fp32). The output records the one used.\n"
    "  --device D          where the engine runs: cpu (default), cuda or cuda:N (GPU N; needs a\n"
    "                      `make CUDA=1` build and a GPU: an absent device is an error, never a\n"
    "                      fallback to the CPU)\n"
    "  --json              print one JSON object instead of text\n"
    M2D_CMD_ATTENTION_USAGE
    M2D_CMD_PASS_USAGE
    "                 (the spill file goes to $TMPDIR, unlinked at once)\n"
    "\n"
    "Example:\n"
    "  moe2dense ppl --model ../shared/models/tiny-qwen3moe \\\n"
    "      --data data/wikitext-2-raw/wikitext-2-raw/wiki.test.raw --protocol lm-eval\n";

static void print_result(const m2d_ppl_result *r, const char *model, const char *data, m2d_precision asked,
                         m2d_engine *e, const char *device, int json) {
    m2d_precision used = m2d_engine_precision(e);
    const char *pass = m2d_engine_pass(e)->layer_major ? "layer-major" : "window-major";
    int gptq = strcmp(r->protocol, "gptq") == 0;
    if (json) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "protocol", r->protocol);
        cJSON_AddStringToObject(o, "precision", m2d_precision_name(used));
        cJSON_AddStringToObject(o, "precision_requested", m2d_precision_name(asked));
        cJSON_AddStringToObject(o, "attention", m2d_precision_name(m2d_engine_attention_precision(e)));
        cJSON_AddStringToObject(o, "device", device);
        cJSON_AddStringToObject(o, "pass", pass);
        cJSON_AddStringToObject(o, "model", model);
        cJSON_AddStringToObject(o, "data", data);
        cJSON_AddNumberToObject(o, "seq_len", r->seq_len);
        cJSON_AddNumberToObject(o, "windows", r->windows);
        cJSON_AddNumberToObject(o, "tokens_scored", (double)r->tokens_scored);
        cJSON_AddNumberToObject(o, "nll_sum", r->nll_sum);
        if (gptq) {
            cJSON_AddNumberToObject(o, "ppl", r->ppl);
        } else {
            cJSON_AddNumberToObject(o, "docs", r->docs);
            cJSON_AddNumberToObject(o, "words", (double)r->words);
            cJSON_AddNumberToObject(o, "bytes", (double)r->bytes);
            cJSON_AddNumberToObject(o, "word_perplexity", r->word_perplexity);
            cJSON_AddNumberToObject(o, "byte_perplexity", r->byte_perplexity);
            cJSON_AddNumberToObject(o, "bits_per_byte", r->bits_per_byte);
        }
        cJSON_AddNumberToObject(o, "seconds", r->seconds);
        cJSON_AddNumberToObject(o, "peak_rss_mib", m2d_cmd_peak_rss_mib());
        char *s = cJSON_PrintUnformatted(o);
        printf("%s\n", s);
        free(s);
        cJSON_Delete(o);
        return;
    }
    printf("protocol       %s\n", r->protocol);
    printf("precision      %s (requested %s)\n", m2d_precision_name(used), m2d_precision_name(asked));
    printf("attention      %s\n", m2d_precision_name(m2d_engine_attention_precision(e)));
    printf("device         %s\n", device);
    printf("pass           %s\n", pass);
    printf("seq_len        %d\n", r->seq_len);
    printf("windows        %d\n", r->windows);
    printf("tokens_scored  %lld\n", (long long)r->tokens_scored);
    if (gptq) {
        printf("ppl            %.6f\n", r->ppl);
    } else {
        printf("docs           %d (words %lld, bytes %lld)\n", r->docs, (long long)r->words, (long long)r->bytes);
        printf("word_perplexity %.6f\n", r->word_perplexity);
        printf("byte_perplexity %.6f\n", r->byte_perplexity);
        printf("bits_per_byte  %.6f\n", r->bits_per_byte);
    }
    printf("seconds        %.1f (%.0f tokens/s)\n", r->seconds, r->tokens_scored / (r->seconds > 0 ? r->seconds : 1));
}

static int cmd_ppl_run(int argc, char **argv) {
    const char *model_dir = NULL, *data = NULL, *protocol = "gptq", *seq = NULL, *maxw = NULL, *threads = NULL,
               *device = "cpu";
    const char *prec_s = "fp32", *pass_s = NULL, *budget_s = NULL, *attn_s = NULL;
    int json = 0, npos = 0;
    m2d_opt opts[] = {{"--model", 1, &model_dir, NULL},   {"--data", 1, &data, NULL},
                      {"--protocol", 1, &protocol, NULL}, {"--seq-len", 1, &seq, NULL},
                      {"--max-windows", 1, &maxw, NULL},  {"--threads", 1, &threads, NULL},
                      {"--precision", 1, &prec_s, NULL},  {"--device", 1, &device, NULL},
                      {"--json", 0, NULL, &json},         {"--pass", 1, &pass_s, NULL},
                      {"--mem-budget", 1, &budget_s, NULL}, {"--attention", 1, &attn_s, NULL},
                      {0}};
    if (m2d_parse_opts("ppl", argc, argv, opts, NULL, 0, &npos)) return m2d_cmd_fail("ppl");
    if (!model_dir || !data) {
        m2d_err("ppl: --model and --data are required (see 'moe2dense help ppl')");
        return m2d_cmd_fail("ppl");
    }
    if (strcmp(protocol, "gptq") && strcmp(protocol, "lm-eval")) {
        m2d_err("ppl: --protocol '%s': expected gptq or lm-eval", protocol);
        return m2d_cmd_fail("ppl");
    }
    long L = 0, mw = 0, nt = 0;
    m2d_precision prec, attn;
    m2d_pass_mode pass;
    size_t budget;
    if (m2d_precision_parse(prec_s, "ppl: --precision", &prec) || m2d_device_check(device, "ppl: --device") ||
        m2d_cmd_attention_arg("ppl", attn_s, &attn) ||
        m2d_cmd_pass_args("ppl", pass_s, budget_s, &pass, &budget) ||
        (seq && m2d_parse_int("ppl", "--seq-len", seq, 2, 1 << 24, &L)) ||
        (maxw && m2d_parse_int("ppl", "--max-windows", maxw, 1, 1L << 30, &mw)) ||
        (threads && m2d_parse_int("ppl", "--threads", threads, 1, 1024, &nt)))
        return m2d_cmd_fail("ppl");
    size_t len;
    char *text = m2d_read_file(data, &len);
    if (!text) return m2d_cmd_fail("ppl");
    if (len == 0) {
        free(text);
        m2d_err("%s: empty data file", data);
        return m2d_cmd_fail("ppl");
    }
    if (m2d_ppl_check_utf8(data, text, len)) {
        free(text);
        return m2d_cmd_fail("ppl");
    }
    m2d_model *m = NULL;
    m2d_tokenizer *tk = NULL;
    m2d_engine *e = NULL;
    m2d_ppl_result r;
    int rc = m2d_model_open_lazy(model_dir, &m);
    if (rc == 0) rc = m2d_tokenizer_load(model_dir, &tk);
    if (rc == 0)
        rc = m2d_engine_open(m, &(m2d_engine_opts){.backend = device, .n_threads = (int)nt, .precision = prec,
                                                    .pass = pass, .mem_budget = budget, .attention = attn}, &e);
    if (rc == 0 && !json) m2d_cmd_print_pass("ppl", m, pass, budget, 0);
    if (rc == 0) {
        int Lu;
        rc = m2d_ppl_seq_len(e, protocol, (int)L, &Lu); /* fail fast, before tokenizing */
    }
    if (rc == 0)
        rc = strcmp(protocol, "gptq") == 0 ? m2d_ppl_gptq(e, tk, text, len, (int)L, (int)mw, &r)
                                           : m2d_ppl_lmeval(e, tk, text, len, (int)L, (int)mw, &r);
    if (rc == 0) print_result(&r, model_dir, data, prec, e, device, json);
    m2d_engine_free(e);
    m2d_tokenizer_free(tk);
    m2d_model_close(m);
    free(text);
    return rc ? m2d_cmd_fail("ppl") : 0;
}

M2D_COMMAND(ppl, "ppl", "WikiText-2 perplexity (gptq or lm-eval protocol)", ppl_usage, cmd_ppl_run)
