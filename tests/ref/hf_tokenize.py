"""Reference encoder for tests/test_tokenizer.c: Hugging Face `tokenizers` (the Rust library behind
every HF fast tokenizer, pinned in requirements.txt) on a tokenizer.json.

usage: hf_tokenize.py TOKENIZER_JSON FILE...
       hf_tokenize.py --pairs TOKENIZER_JSON FILE [TOKENIZER_JSON FILE]...

For each FILE (read as UTF-8, line ends kept as they are), prints its ids, encoded with
add_special_tokens=False (what moe2dense tokenize and lm-eval's causal models do), space-separated
on one line; with --pairs each FILE is encoded by the tokenizer.json before it.
"""
import sys

from tokenizers import Tokenizer


def main(argv):
    pairs = argv[1:2] == ["--pairs"]
    args = argv[2:] if pairs else argv[1:]
    if len(args) < 2 or (pairs and len(args) % 2):
        sys.exit(__doc__)
    jobs = list(zip(args[0::2], args[1::2])) if pairs else [(args[0], f) for f in args[1:]]
    tokenizers = {}
    out = []
    for tokenizer_json, path in jobs:
        if tokenizer_json not in tokenizers:
            tokenizers[tokenizer_json] = Tokenizer.from_file(tokenizer_json)
        with open(path, encoding="utf-8", newline="") as f:
            text = f.read()
        ids = tokenizers[tokenizer_json].encode(text, add_special_tokens=False).ids
        out.append(" ".join(map(str, ids)))
    sys.stdout.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main(sys.argv)
