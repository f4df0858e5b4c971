"""The multiple-choice requests that lm-evaluation-harness itself builds (lm-eval, pinned in
tests/ref/requirements.txt), from the local data files, for tests/test_mc.c and make verify-lm-eval.

usage: lm_eval_requests.py [--summary | --hashes] [--seed S] [--jobs N] DATA_DIR SPEC...
SPEC: TASK:SHOTS[:LIMIT]   TASK: arc_easy | arc_challenge | winogrande | hellaswag | mmlu (the 57
      subjects) | mmlu_<subject>; LIMIT: first LIMIT documents (per subject), default all

Output (stdout), per SPEC in order:
  default    one JSON line per request, {"task", "doc", "choice", "context", "continuation"}: the
             format of `moe2dense eval --dump-requests`
  --summary  per task one JSON line {"spec", "task", "shots", "n", "acc", "acc_norm"} (spec: the
             SPEC's index; mmlu gives a line per subject): lm-eval's own process_results over a
             hand-made model (toy_ll, the one of tests/test_mc.c)
  --hashes   a "# " header (versions, data variant), then per task "## TASK SHOTS N_DOCS" and per
             document the first 16 hex digits of sha256(context NUL continuation NUL, for each of
             its requests in order): tests/golden/lm_eval_requests.txt

lm-eval runs its own task configs (lm_eval/tasks/*/*.yaml, helper functions included), loaded
through YAML files that `include` them and only point the dataset at local files: the data files
are rewritten into the fields of the Hugging Face datasets those configs load (the mapping of
data/LM_EVAL_TASKS.md; nothing else changes). Where the data here forces a deviation, lm-eval is
given the same one as moe2dense: Winogrande's pool is train_l when train_xl is absent; without the
canonical HellaSwag jsonl, the lossy text variant's items are already processed (query, choices),
so its override sets process_docs to null and drops the train split (few-shot pool = validation
minus the current item, which lm-eval's sampler does by itself since fewshot_split == test_split).
No network: the datasets are local JSON files and the hub is switched off.
"""
import argparse
import csv
import hashlib
import json
import logging
import os
import sys
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TQDM_DISABLE", "1")

ARC = "arc/ARC-V1-Feb2018-2"
WINO = "winogrande/winogrande_1.1"
HS_JSONL = "hellaswag/data"
HS_TEXT = "hellaswag/derived/klosax-hellaswag_text_data/hellaswag_val_full.txt"


def toy_ll(context, continuation):
    """The hand-made model of tests/test_mc.c: -(FNV-1a 64 of context NUL continuation mod 1000003) / 1000."""
    h = 0xCBF29CE484222325
    for b in context.encode("utf-8") + b"\0" + continuation.encode("utf-8"):
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return -((h % 1000003) / 1000.0)


def write_jsonl(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    return path


def read_jsonl(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


# ---- the data files, in the fields of the HF datasets lm-eval's configs load ------------------

def arc_files(data, out, name):
    sub = {"arc_easy": "Easy", "arc_challenge": "Challenge"}[name]
    files = {}
    for split, fname in (("train", "Train"), ("validation", "Dev"), ("test", "Test")):
        rows = []
        for j in read_jsonl(f"{data}/{ARC}/ARC-{sub}/ARC-{sub}-{fname}.jsonl"):
            q = j["question"]
            rows.append({"id": j["id"], "question": q["stem"],
                         "choices": {"text": [c["text"] for c in q["choices"]],
                                     "label": [c["label"] for c in q["choices"]]},
                         "answerKey": j["answerKey"]})
        files[split] = write_jsonl(f"{out}/{name}-{split}.jsonl", rows)
    return {"data_files": files}


def winogrande_files(data, out):
    pool = f"{data}/{WINO}/train_xl.jsonl"
    if not os.path.exists(pool):
        pool = f"{data}/{WINO}/train_l.jsonl"  # the same fallback as moe2dense (a recorded deviation)
    keep = ("sentence", "option1", "option2", "answer")
    files = {split: write_jsonl(f"{out}/winogrande-{split}.jsonl", [{k: j[k] for k in keep} for j in read_jsonl(src)])
             for split, src in (("train", pool), ("validation", f"{data}/{WINO}/dev.jsonl"))}
    return {"data_files": files}


def hellaswag_files(data, out):
    val, train = f"{data}/{HS_JSONL}/hellaswag_val.jsonl", f"{data}/{HS_JSONL}/hellaswag_train.jsonl"
    if os.path.exists(val):  # canonical: lm-eval's config unchanged (process_docs included)
        def hf(j):
            return dict(j, label=str(j["label"]))  # HF keeps every field; label becomes a string
        files = {"validation": write_jsonl(f"{out}/hellaswag-validation.jsonl", map(hf, read_jsonl(val)))}
        if os.path.exists(train):
            files["train"] = write_jsonl(f"{out}/hellaswag-train.jsonl", map(hf, read_jsonl(train)))
        return {"data_files": files}, ({} if os.path.exists(train) else {"training_split": None})
    with open(f"{data}/{HS_TEXT}", encoding="utf-8") as f:
        lines = f.read().split("\n")
    rows = [{"ind": k, "query": lines[6 * k], "label": lines[6 * k + 1], "choices": lines[6 * k + 2: 6 * k + 6]}
            for k in range(len(lines) // 6)]
    files = {"validation": write_jsonl(f"{out}/hellaswag-validation.jsonl", rows)}
    return {"data_files": files}, {"training_split": None, "process_docs": None}


def mmlu_subjects(data):
    return sorted(f[: -len("_test.csv")] for f in os.listdir(f"{data}/mmlu/data/test") if f.endswith("_test.csv"))


def mmlu_files(data, out, subject):
    files = {}
    for split in ("dev", "test"):
        with open(f"{data}/mmlu/data/{split}/{subject}_{split}.csv", encoding="utf-8", newline="") as f:
            rows = [{"question": r[0], "subject": subject, "choices": r[1:5], "answer": "ABCD".index(r[5])}
                    for r in csv.reader(f)]
        files[split] = write_jsonl(f"{out}/mmlu_{subject}-{split}.jsonl", rows)
    return {"data_files": files}


def write_override(tasks_dir, yaml_path, task, dataset_kwargs, extra=None):
    """A task YAML that includes lm-eval's own and changes only where the data comes from."""
    cfg = {"include": yaml_path, "task": task, "dataset_path": "json", "dataset_name": None,
           "dataset_kwargs": dataset_kwargs}
    cfg.update(extra or {})
    with open(f"{tasks_dir}/{task}.yaml", "w", encoding="utf-8") as f:
        json.dump(cfg, f)  # JSON is YAML


def prepare(data, specs, tmp):
    import lm_eval
    builtin = os.path.join(os.path.dirname(lm_eval.__file__), "tasks")
    tasks_dir = f"{tmp}/tasks"
    os.makedirs(tasks_dir)
    names = set(t for t, _, _ in specs)
    if "mmlu" in names:
        names.discard("mmlu")
        names.update(f"mmlu_{s}" for s in mmlu_subjects(data))
    for name in sorted(names):
        if name in ("arc_easy", "arc_challenge"):
            write_override(tasks_dir, f"{builtin}/arc/{name}.yaml", name, arc_files(data, tmp, name))
        elif name == "winogrande":
            write_override(tasks_dir, f"{builtin}/winogrande/default.yaml", name, winogrande_files(data, tmp))
        elif name == "hellaswag":
            kwargs, extra = hellaswag_files(data, tmp)
            write_override(tasks_dir, f"{builtin}/hellaswag/hellaswag.yaml", name, kwargs, extra)
        elif name.startswith("mmlu_"):
            subject = name[len("mmlu_"):]
            write_override(tasks_dir, f"{builtin}/mmlu/default/{name}.yaml", name, mmlu_files(data, tmp, subject),
                           {"dataset_name": None})
        else:
            sys.exit(f"lm_eval_requests.py: unknown task '{name}'")
    return tasks_dir


# ---- requests ----------------------------------------------------------------------------------

def build(tasks_dir, task, shots, limit, seed):
    """lm-eval's instances of one task, grouped per document: [(doc, [(context, continuation)])]."""
    from lm_eval.tasks import TaskManager
    t = TaskManager(include_path=tasks_dir, include_defaults=False).load([task])["tasks"][task]
    t.set_config(key="num_fewshot", value=shots)  # what simple_evaluate does with num_fewshot
    t.set_fewshot_seed(seed=seed)                 # and with fewshot_random_seed
    t.build_all_requests(limit=limit or None, rank=0, world_size=1)
    docs = {}
    for inst in sorted(t.instances, key=lambda i: (i.doc_id, i.idx)):
        docs.setdefault(inst.doc_id, (inst.doc, []))[1].append(tuple(inst.arguments))
    return t, [docs[k] for k in sorted(docs)]


def doc_hash(reqs):
    h = hashlib.sha256()
    for ctx, cont in reqs:
        h.update(ctx.encode("utf-8") + b"\0" + cont.encode("utf-8") + b"\0")
    return h.hexdigest()[:16]


def hashes_header(data, seed):
    import lm_eval
    hs = "canonical jsonl" if os.path.exists(f"{data}/{HS_JSONL}/hellaswag_val.jsonl") else "text variant"
    wg = "train_xl" if os.path.exists(f"{data}/{WINO}/train_xl.jsonl") else "train_l"
    return (f"# The requests lm-eval {lm_eval.__version__} builds (tests/ref/lm_eval_requests.py --hashes),"
            f" fewshot seed {seed}; data: HellaSwag {hs}, Winogrande pool {wg}.\n"
            "# Per task '## TASK SHOTS N_DOCS', then per document the first 16 hex digits of\n"
            "# sha256(context NUL continuation NUL ...) over its requests in order.\n"
            "# Checked by tests/test_mc.c; rewrite: make lm-eval-goldens; live check: make verify-lm-eval.\n")


def run_one(args):
    mode, spec, tasks_dir, task, shots, limit, seed = args
    t, docs = build(tasks_dir, task, shots, limit, seed)
    out = []
    if mode == "requests":
        for d, (_, reqs) in enumerate(docs):
            for c, (ctx, cont) in enumerate(reqs):
                out.append(json.dumps({"task": task, "doc": d, "choice": c, "context": ctx, "continuation": cont},
                                      ensure_ascii=False))
    elif mode == "hashes":
        out.append(f"## {task} {shots} {len(docs)}")
        out.extend(doc_hash(reqs) for _, reqs in docs)
    else:
        acc = acc_norm = 0.0
        for doc, reqs in docs:
            r = t.process_results(doc, [(toy_ll(ctx, cont), False) for ctx, cont in reqs])
            acc += r["acc"]
            acc_norm += r.get("acc_norm", 0.0)
        out.append(json.dumps({"spec": spec, "task": task, "shots": shots, "n": len(docs), "acc": round(acc),
                               "acc_norm": round(acc_norm) if "acc_norm" in r else None}))
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(usage=__doc__)
    ap.add_argument("--summary", action="store_true")
    ap.add_argument("--hashes", action="store_true")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("data")
    ap.add_argument("specs", nargs="+")
    a = ap.parse_args()
    logging.disable(logging.WARNING)
    specs = []
    for s in a.specs:
        parts = s.split(":")
        if len(parts) not in (2, 3):
            sys.exit(f"lm_eval_requests.py: bad SPEC '{s}' (TASK:SHOTS[:LIMIT])")
        specs.append((parts[0], int(parts[1]), int(parts[2]) if len(parts) == 3 else 0))
    mode = "summary" if a.summary else "hashes" if a.hashes else "requests"
    with tempfile.TemporaryDirectory(prefix="m2d-lm-eval-") as tmp:
        os.environ["HF_HOME"] = f"{tmp}/hf"  # the datasets cache stays in the temporary folder
        tasks_dir = prepare(a.data, specs, tmp)
        jobs = []
        for k, (task, shots, limit) in enumerate(specs):
            names = [f"mmlu_{s}" for s in mmlu_subjects(a.data)] if task == "mmlu" else [task]
            jobs.extend((mode, k, tasks_dir, n, shots, limit, a.seed) for n in names)
        if a.jobs > 1:
            import multiprocessing
            with multiprocessing.get_context("fork").Pool(a.jobs) as pool:
                results = pool.map(run_one, jobs, chunksize=1)
        else:
            results = map(run_one, jobs)
        if mode == "hashes":
            sys.stdout.write(hashes_header(a.data, a.seed))
        for r in results:
            sys.stdout.write(r + "\n")


if __name__ == "__main__":
    main()
