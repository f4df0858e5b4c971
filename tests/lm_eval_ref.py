#!/usr/bin/env python3
"""Independent reference for tests/test_mc.c: builds lm-eval's multiple-choice requests for the
first N documents of a task straight from the data files, with Python's own `random`, following
data/LM_EVAL_TASKS.md. Prints one JSON line per request:
{"task", "doc", "choice", "context", "continuation"} (the format of `eval --dump-requests`).

usage: lm_eval_ref.py DATA_DIR TASK SHOTS LIMIT [SEED]
TASK: arc_easy | arc_challenge | winogrande | hellaswag | mmlu_<subject>
"""
import csv, json, os, random, re, sys


def toy_ll(context, continuation):
    """The hand-made model of tests/test_mc.c: FNV-1a 64 of context + NUL + continuation."""
    h = 0xcbf29ce484222325
    for b in context.encode("utf-8") + b"\0" + continuation.encode("utf-8"):
        h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return -((h % 1000003) / 1000.0)


def argmax(xs):
    best = 0
    for i, x in enumerate(xs):
        if x > xs[best]:
            best = i
    return best


def arc(data, name):
    sub = {"arc_easy": "Easy", "arc_challenge": "Challenge"}[name]
    base = f"{data}/arc/ARC-V1-Feb2018-2/ARC-{sub}/ARC-{sub}"
    def load(split):
        docs = []
        for line in open(f"{base}-{split}.jsonl", encoding="utf-8"):
            j = json.loads(line)
            labels = [c["label"] for c in j["question"]["choices"]]
            docs.append({"raw": j, "text": "Question: " + j["question"]["stem"] + "\nAnswer:",
                         "choices": [c["text"] for c in j["question"]["choices"]],
                         "gold": labels.index(j["answerKey"])})
        return docs
    return load("Test"), load("Train"), False, ""


def winogrande(data):
    base = f"{data}/winogrande/winogrande_1.1"
    def load(path):
        docs = []
        for line in open(path, encoding="utf-8"):
            j = json.loads(line)
            i = j["sentence"].index("_")
            docs.append({"raw": (j["sentence"], j["option1"], j["option2"], j["answer"]),
                         "contexts": [j["sentence"][:i] + j["option1"], j["sentence"][:i] + j["option2"]],
                         "target": j["sentence"][i + 1:].strip(), "gold": {"1": 0, "2": 1}[j["answer"]]})
        return docs
    pool = f"{base}/train_xl.jsonl"
    if not os.path.exists(pool):
        pool = f"{base}/train_l.jsonl"
    return load(f"{base}/dev.jsonl"), load(pool), False, ""


def hellaswag_text(data):
    lines = open(f"{data}/hellaswag/derived/klosax-hellaswag_text_data/hellaswag_val_full.txt",
                 encoding="utf-8").read().split("\n")
    docs = []
    for k in range(len(lines) // 6):
        q, g, *e = lines[6 * k: 6 * k + 6]
        docs.append({"raw": ("validation", k), "text": q, "choices": e, "gold": int(g)})
    return docs, docs, True, ""


def mmlu(data, subject):
    def load(split):
        docs = []
        with open(f"{data}/mmlu/data/{split}/{subject}_{split}.csv", encoding="utf-8", newline="") as f:
            for row in csv.reader(f):
                q, a, b, c, d, ans = row
                docs.append({"raw": tuple(row) + (subject,),
                             "text": f"{q.strip()}\nA. {a}\nB. {b}\nC. {c}\nD. {d}\nAnswer:",
                             "choices": ["A", "B", "C", "D"], "gold": "ABCD".index(ans)})
        return docs
    desc = f"The following are multiple choice questions (with answers) about {subject.replace('_', ' ')}.\n\n"
    return load("test"), load("dev"), False, desc


def main():
    data, task, shots, limit = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    seed = int(sys.argv[5]) if len(sys.argv) > 5 else 1234
    first_n = task.startswith("mmlu_")
    # lm-eval: n_samples = k + 1 if config.fewshot_split == config.test_split; hellaswag and
    # winogrande set neither (None == None), arc has test_split "test", mmlu fewshot_split "dev"
    draw_extra = task in ("hellaswag", "winogrande")
    if task in ("arc_easy", "arc_challenge"):
        ev, pool, pool_is_eval, desc = arc(data, task)
    elif task == "winogrande":
        ev, pool, pool_is_eval, desc = winogrande(data)
    elif task == "hellaswag":
        ev, pool, pool_is_eval, desc = hellaswag_text(data)
    else:
        ev, pool, pool_is_eval, desc = mmlu(data, task[len("mmlu_"):])
    rnd = random.Random(seed)
    multi = task == "winogrande"
    summary = os.environ.get("REF_SUMMARY") == "1"
    acc = acc_norm = 0
    for i, doc in enumerate(ev[:limit]):
        ctx = desc
        if shots > 0:
            if first_n:
                drawn = pool[:shots]
            else:
                drawn = rnd.sample(pool, shots + 1 if (pool_is_eval or draw_extra) else shots)
            chosen = [x for x in drawn if x["raw"] != doc["raw"]][:shots]
            for ex in chosen:
                if multi:
                    ctx += ex["contexts"][ex["gold"]] + " " + ex["target"] + "\n\n"
                else:
                    ctx += ex["text"] + " " + ex["choices"][ex["gold"]] + "\n\n"
        if multi:
            reqs = [(ctx + c, " " + doc["target"]) for c in doc["contexts"]]
        else:
            reqs = [(ctx + doc["text"], " " + c) for c in doc["choices"]]
        if summary:
            lls = [toy_ll(a, b) for a, b in reqs]
            acc += argmax(lls) == doc["gold"]
            if not multi:
                acc_norm += argmax([ll / float(len(ch)) for ll, ch in zip(lls, doc["choices"])]) == doc["gold"]
            continue
        for c, (a, b) in enumerate(reqs):
            print(json.dumps({"task": task, "doc": i, "choice": c, "context": a, "continuation": b}))
    if summary:
        print(json.dumps({"n": min(limit, len(ev)), "acc": acc, "acc_norm": acc_norm}))


main()
