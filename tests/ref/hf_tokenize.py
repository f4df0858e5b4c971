"""Reference encoder for tests/test_tokenizer.c: Hugging Face `tokenizers` (the Rust library behind
every HF fast tokenizer, pinned in requirements.txt) on a tokenizer.json.

usage: hf_tokenize.py [--decode] [--special] TOKENIZER_JSON FILE...
       hf_tokenize.py [--decode] [--special] --pairs TOKENIZER_JSON FILE [TOKENIZER_JSON FILE]...

For each FILE (read as UTF-8, line ends kept as they are), prints its ids, encoded with
add_special_tokens=False (what moe2dense tokenize and lm-eval's causal models do), space-separated
on one line; with --pairs each FILE is encoded by the tokenizer.json before it. With --decode a
second line follows each: the UTF-8 bytes of decode(ids, skip_special_tokens=False) in hex (what
moe2dense tokenize --decode prints for those ids), "-" for empty. With --special a last line
follows each: the ids encoded with add_special_tokens=True (the post-processor's template).
"""
import sys

from tokenizers import Tokenizer


def main(argv):
    args = argv[1:]
    flags = set()
    while args and args[0] in ("--pairs", "--decode", "--special"):
        flags.add(args.pop(0))
    pairs = "--pairs" in flags
    if len(args) < 2 or (pairs and len(args) % 2):
        sys.exit(__doc__)
    jobs = list(zip(args[0::2], args[1::2])) if pairs else [(args[0], f) for f in args[1:]]
    tokenizers = {}
    out = []
    for tokenizer_json, path in jobs:
        if tokenizer_json not in tokenizers:
            tokenizers[tokenizer_json] = Tokenizer.from_file(tokenizer_json)
        tok = tokenizers[tokenizer_json]
        with open(path, encoding="utf-8", newline="") as f:
            text = f.read()
        ids = tok.encode(text, add_special_tokens=False).ids
        out.append(" ".join(map(str, ids)))
        if "--decode" in flags:
            out.append(tok.decode(ids, skip_special_tokens=False).encode("utf-8").hex() or "-")
        if "--special" in flags:
            out.append(" ".join(map(str, tok.encode(text, add_special_tokens=True).ids)))
    sys.stdout.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main(sys.argv)
