"""Small tokenizers with the exact tokenizer.json pipeline of each MoE family moe2dense supports,
trained with Hugging Face `tokenizers` (the pinned test reference, tests/ref/.venv). The real
vocabularies are not available here; these are test fixtures derived from data, made at test time
(tests/test_tokenizer.c, into the build directory) and never committed.

usage: train_tokenizers.py [--data FILE] OUT_DIR

Writes OUT_DIR/FAMILY/tokenizer.json (+ tokenizer_config.json) for every family in FAMILIES and
OUT_DIR/STAMP. A directory whose STAMP matches (this script, the tokenizers version, the training
text) is reused as it is; otherwise everything is retrained into a fresh directory that replaces
OUT_DIR at once, so readers never see half a set. Deterministic: the same inputs give the same
files byte for byte (single-threaded training).

Pipelines (normalizer / pre-tokenizer / model options / decoder / added tokens) as the families'
own tokenizer.json files declare them:
  deepseek-v2   DeepSeek-V2(-Lite), DeepSeek LLM: empty normalizer Sequence; Sequence of Split
                regexes (newlines, letters, punctuation, trailing spaces, CJK), Digits (individual),
                ByteLevel without regex; ByteLevel decoder; BOS/EOS added tokens (normalized) and
                single Latin-1 characters as non-special added tokens; post-processor adds BOS.
  gpt-oss       GPT-OSS (o200k_harmony): no normalizer; Split with the o200k regex (case classes,
                (?i:...) contractions, \\p{N}{1,3}), ByteLevel without regex; ignore_merges and a
                ByteLevel post-processor (as the tiktoken conversion writes); the harmony special tokens.
  olmoe         OLMoE (GPT-NeoX tokenizer as OLMo's Dolma version has it): NFC; ByteLevel with the
                GPT-2 regex; added tokens for runs of 2..24 spaces and the PII masks |||EMAIL_ADDRESS|||,
                |||PHONE_NUMBER|||, |||IP_ADDRESS||| (normalized, not special), <|endoftext|>, <|padding|>.
  mixtral       Mixtral / Mistral / Llama-2 SentencePiece BPE, legacy conversion: normalizer
                Sequence[Prepend("▁"), Replace(" ", "▁")], no pre-tokenizer; BPE with byte_fallback
                (<0x00>..<0xFF> at ids 3..258), fuse_unk, <unk>; decoder Sequence[Replace("▁", " "),
                ByteFallback, Fuse, Strip(" ", 1, 0)]; post-processor adds <s>.
  mistral-metaspace  the same model, non-legacy conversion: no normalizer, Metaspace pre-tokenizer
                (replacement "▁", prepend_scheme "first", split false).
Qwen2-MoE uses the Qwen2 tokenizer, the pipeline of the real Qwen3 tokenizer the tests also use.
"""
import argparse
import fcntl
import hashlib
import json
import os
import shutil
import sys
import time

os.environ["RAYON_NUM_THREADS"] = "1"  # before tokenizers starts its pool: deterministic training

import tokenizers  # noqa: E402
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers  # noqa: E402

DEFAULT_DATA = "data/train-text/wikitext-103-train-prefix/wiki.train.tokens"
VOCAB = 4096
SP = "\u2581"  # SentencePiece's meta space "▁"

# DeepSeek-V2's pre-tokenizer regexes, code point for code point (escapes keep look-alikes apart)
DEEPSEEK_LETTERS = (
    "A-Za-z\u00B5\u00C0-\u00D6\u00D8-\u00F6\u00F8-\u01BA\u01BC-\u01BF\u01C4-\u0293\u0295-\u02AF"
    "\u0370-\u0373\u0376\u0377\u037B-\u037D\u037F\u0386\u0388-\u038A\u038C\u038E-\u03A1\u03A3-\u03F5"
    "\u03F7-\u0481\u048A-\u052F\u0531-\u0556\u10A0-\u10C5\u13A0-\u13F5\u13F8-\u13FD\u1C90-\u1CBA"
    "\u1CBD-\u1CBF\u1D00-\u1D2B\u1D6B-\u1D77\u1D79-\u1D9A\u1E00-\u1F15\u1F18-\u1F1D\u1F20-\u1F45"
    "\u1F48-\u1F4D\u1F50-\u1F57\u1F59\u1F5B\u1F5D\u1F5F-\u1F7D\u1F80-\u1FB4\u1FB6-\u1FBC\u1FBE"
    "\u1FC2-\u1FC4\u1FC6-\u1FCC\u1FD0-\u1FD3\u1FD6-\u1FDB\u1FE0-\u1FEC\u1FF2-\u1FF4\u1FF6-\u1FFC"
    "\u2102\u2107\u210A-\u2113\u2115\u2119-\u211D\u2124\u2126\u2128\u212A-\u212D\u212F-\u2134"
    "\u2139\u213C-\u213F\u2145-\u2149\u214E\u2183\u2184\u2C00-\u2C7B\u2C7E-\u2CE4\u2CEB-\u2CEE"
    "\u2CF2\u2CF3\uA640-\uA66D\uA680-\uA69B\uA722-\uA76F\uA771-\uA787\uA78B-\uA78E\uAB70-\uABBF"
    "\uFB00-\uFB06\uFB13-\uFB17\uFF21-\uFF3A\uFF41-\uFF5A\U00010400-\U0001044F\U000104B0-\U000104D3"
    "\U000104D8-\U000104FB\U00010C80-\U00010CB2\U00010CC0-\U00010CF2\U000118A0-\U000118DF"
    "\U0001E900-\U0001E943")
DEEPSEEK_SPLITS = [
    "[\r\n]",
    "\\s?[" + DEEPSEEK_LETTERS + "]+",
    "\\s?[!-/:-~\uFF01-\uFF0F\uFF1A-\uFF5E\u2018-\u201F\u3000-\u3002]+",
    "\\s+$",
    "[\u4E00-\u9FA5\u0800-\u4E00\uAC00-\uD7FF]+",
]
DEEPSEEK_BOS = "<\uFF5Cbegin\u2581of\u2581sentence\uFF5C>"
DEEPSEEK_EOS = "<\uFF5Cend\u2581of\u2581sentence\uFF5C>"
DEEPSEEK_CHARS = "\u00F8\u00F6\u00FA\u00FF\u00F5\u00F7\u00FB\u00FD\u00C0\u00F9\u00C1\u00FE\u00FC"

O200K = "|".join([
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    "\\p{N}{1,3}",
    " ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*",
    "\\s*[\\r\\n]+",
    "\\s+(?!\\S)",
    "\\s+",
])
OLMO_PII = ["|||IP_ADDRESS|||", "|||EMAIL_ADDRESS|||", "|||PHONE_NUMBER|||"]  # Dolma's PII masks
HARMONY = ["<|startoftext|>", "<|endoftext|>", "<|return|>", "<|constrain|>", "<|channel|>", "<|start|>",
           "<|end|>", "<|message|>", "<|call|>", "<|endofprompt|>"]


def special(content, normalized=False):
    return AddedToken(content, single_word=False, lstrip=False, rstrip=False, normalized=normalized, special=True)


def plain(content):
    return AddedToken(content, single_word=False, lstrip=False, rstrip=False, normalized=True, special=False)


def byte_level_bpe(lines, pre_tokenizer, specials=(), **model_opts):
    """A byte-level BPE trained with the family's own pre-tokenizer."""
    tok = Tokenizer(models.BPE(**model_opts))
    tok.pre_tokenizer = pre_tokenizer
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=list(specials))
    tok.train_from_iterator(lines, trainer)
    tok.decoder = decoders.ByteLevel()
    return tok


def deepseek_v2(lines):
    pre = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r), behavior="isolated", invert=False) for r in DEEPSEEK_SPLITS]
        + [pre_tokenizers.Digits(individual_digits=True),
           pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    tok = byte_level_bpe(lines, pre)
    tok.normalizer = normalizers.Sequence([])
    tok.add_special_tokens([special(DEEPSEEK_BOS, normalized=True), special(DEEPSEEK_EOS, normalized=True)])
    tok.add_tokens([plain(c) for c in DEEPSEEK_CHARS])
    bos = tok.token_to_id(DEEPSEEK_BOS)
    tok.post_processor = processors.TemplateProcessing(single=DEEPSEEK_BOS + " $A", pair=DEEPSEEK_BOS + " $A $B:1",
                                                       special_tokens=[(DEEPSEEK_BOS, bos)])
    token = {"__type": "AddedToken", "lstrip": False, "normalized": True, "rstrip": False, "single_word": False}
    config = {"add_bos_token": True, "add_eos_token": False, "bos_token": dict(token, content=DEEPSEEK_BOS),
              "eos_token": dict(token, content=DEEPSEEK_EOS), "legacy": True, "tokenizer_class": "LlamaTokenizerFast"}
    return tok, config


def gpt_oss(lines):
    pre = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(O200K), behavior="isolated", invert=False),
                                   pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok = byte_level_bpe(lines, pre, ignore_merges=True)
    tok.add_special_tokens([special(t) for t in HARMONY])
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    config = {"bos_token": "<|startoftext|>", "eos_token": "<|return|>", "pad_token": "<|endoftext|>",
              "tokenizer_class": "PreTrainedTokenizerFast"}
    return tok, config


def olmoe(lines):
    pre = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    tok = byte_level_bpe(lines, pre, specials=["<|endoftext|>", "<|padding|>"])
    tok.normalizer = normalizers.NFC()
    tok.add_tokens([plain(" " * n) for n in range(24, 1, -1)] + [plain(t) for t in OLMO_PII])
    tok.post_processor = processors.ByteLevel(trim_offsets=True)
    config = {"bos_token": None, "eos_token": "<|endoftext|>", "pad_token": "<|padding|>",
              "tokenizer_class": "GPTNeoXTokenizer"}
    return tok, config


def sentencepiece_bpe(lines):
    """Vocab and merges of a SentencePiece-style BPE: <unk> <s> </s>, the 256 byte tokens, then the
    learned pieces over a limited alphabet (rarer characters fall back to bytes)."""
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.Sequence([normalizers.Prepend(SP), normalizers.Replace(" ", SP)])
    # training only: words are runs of meta spaces and what follows them
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(SP + "*[^" + SP + "]+|" + SP + "+"), behavior="isolated")
    trainer = trainers.BpeTrainer(vocab_size=VOCAB - 256, min_frequency=2, show_progress=False, limit_alphabet=120,
                                  special_tokens=["<unk>", "<s>", "</s>"])
    tok.train_from_iterator(lines, trainer)
    learned = json.loads(tok.to_str())["model"]
    pieces = sorted(learned["vocab"].items(), key=lambda kv: kv[1])
    vocab = {t: i for i, (t, _) in enumerate(pieces[:3])}
    vocab.update({"<0x%02X>" % b: 3 + b for b in range(256)})
    for t, _ in pieces[3:]:
        assert t not in vocab, t
        vocab[t] = len(vocab)
    return vocab, [tuple(m) for m in learned["merges"]]


def mistral(vocab, merges, legacy):
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    if legacy:
        tok.normalizer = normalizers.Sequence([normalizers.Prepend(SP), normalizers.Replace(" ", SP)])
    else:
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SP, prepend_scheme="first", split=False)
    tok.decoder = decoders.Sequence([decoders.Replace(SP, " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(content=" ", left=1, right=0)])
    tok.add_special_tokens([special("<unk>"), special("<s>"), special("</s>")])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B:1",
                                                       special_tokens=[("<s>", 1)])
    config = {"add_bos_token": True, "add_eos_token": False, "bos_token": "<s>", "eos_token": "</s>",
              "unk_token": "<unk>", "legacy": legacy, "tokenizer_class": "LlamaTokenizer"}
    return tok, config


def train_all(lines):
    out = {"deepseek-v2": deepseek_v2(lines), "gpt-oss": gpt_oss(lines), "olmoe": olmoe(lines)}
    vocab, merges = sentencepiece_bpe(lines)
    out["mixtral"] = mistral(vocab, merges, legacy=True)
    out["mistral-metaspace"] = mistral(vocab, merges, legacy=False)
    return out


FAMILIES = ["deepseek-v2", "gpt-oss", "olmoe", "mixtral", "mistral-metaspace"]


def stamp_of(data_path):
    h = hashlib.sha256()
    with open(__file__, "rb") as f:
        h.update(f.read())
    h.update(tokenizers.__version__.encode())
    with open(data_path, "rb") as f:
        h.update(f.read())
    return h.hexdigest()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=DEFAULT_DATA, help="training text (default %(default)s)")
    ap.add_argument("out", help="output directory")
    args = ap.parse_args()
    if not os.path.isfile(args.data):
        sys.exit("train_tokenizers: %s: no such file (run 'make data')" % args.data)
    stamp = stamp_of(args.data)
    out = args.out.rstrip("/")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one trainer at a time; the others then find it done
        try:
            with open(os.path.join(out, "STAMP")) as f:
                if f.read().strip() == stamp:
                    return
        except OSError:
            pass
        t0 = time.time()
        with open(args.data, encoding="utf-8") as f:
            lines = [line for line in f.read().split("\n") if line.strip()]
        tmp = "%s.tmp.%d" % (out, os.getpid())
        shutil.rmtree(tmp, ignore_errors=True)
        for name, (tok, config) in train_all(lines).items():
            os.makedirs(os.path.join(tmp, name))
            tok.save(os.path.join(tmp, name, "tokenizer.json"))
            with open(os.path.join(tmp, name, "tokenizer_config.json"), "w") as f:
                json.dump(config, f, indent=2, ensure_ascii=False)
        with open(os.path.join(tmp, "STAMP"), "w") as f:
            f.write(stamp + "\n")
        shutil.rmtree(out, ignore_errors=True)
        os.rename(tmp, out)
        print("train_tokenizers: %d tokenizers in %s (%.1f s)" % (len(FAMILIES), out, time.time() - t0))


if __name__ == "__main__":
    main()
