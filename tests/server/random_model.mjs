// A servable model folder of random weights for one model family, for running the HTTP suite on
// gpt-oss, DeepSeek-V3 and GLM-4.x MoE:
//
//   node tests/server/random_model.mjs FAMILY OUT_DIR     FAMILY: gpt_oss | deepseek_v3 | glm4_moe
//
// The weights and config.json are the family's parity fixture (tests/data/parity/: a tiny random
// checkpoint made by transformers; the weights symlinked, the config copied with one EOS id). The fixtures have no tokenizer, so this
// writes one sized to the model's vocabulary: ids 0..2 are <|endoftext|>, <|im_start|>,
// <|im_end|> (the bundled spill-tiny's special tokens, so its ChatML chat template and tool format
// apply unchanged), ids 3..258 the 256 byte-level symbols (no merges: every byte is a token), and
// the rest reserved special tokens. A random model's text is noise; tests that need a trained
// model's answers skip themselves when SPILL_TEST_RANDOM_MODEL=1 (run.sh sets it with --family).
import fs from 'node:fs';
import path from 'node:path';

const FIXTURES = {
  gpt_oss: 'gpt_oss_mxfp4',
  deepseek_v3: 'deepseek_v3_per_expert',
  glm4_moe: 'glm4_moe_per_expert',
};

// GPT-2's byte-to-unicode map: printable bytes stand for themselves, the others are shifted past 255.
function byteSymbols() {
  const printable = [];
  for (let b = 0x21; b <= 0x7e; ++b) printable.push(b);
  for (let b = 0xa1; b <= 0xac; ++b) printable.push(b);
  for (let b = 0xae; b <= 0xff; ++b) printable.push(b);
  const symbols = new Array(256);
  for (const b of printable) symbols[b] = String.fromCodePoint(b);
  let next = 256;
  for (let b = 0; b < 256; ++b) if (symbols[b] === undefined) symbols[b] = String.fromCodePoint(next++);
  return symbols;
}

export function writeRandomModel(family, outDir) {
  const fixtureName = FIXTURES[family];
  if (!fixtureName) throw new Error(`unknown family "${family}"; expected one of ${Object.keys(FIXTURES).join(', ')}`);
  const here = path.dirname(new URL(import.meta.url).pathname);
  const root = path.resolve(here, '../..');
  const fixture = path.join(root, 'tests/data/parity', fixtureName);
  const tiny = path.join(root, 'models/spill-tiny');
  const config = JSON.parse(fs.readFileSync(path.join(fixture, 'config.json'), 'utf8'));
  const vocab = config.vocab_size;
  const specials = ['<|endoftext|>', '<|im_start|>', '<|im_end|>'];
  if (vocab < specials.length + 256) throw new Error(`${fixtureName}: a vocabulary of ${vocab} cannot hold 256 bytes`);

  fs.mkdirSync(outDir, { recursive: true });
  fs.symlinkSync(path.join(fixture, 'model.safetensors'), path.join(outDir, 'model.safetensors'));
  // The fixture's config, with <|im_end|> (id 2) as the only EOS: a fixture's other EOS ids (GLM's 3)
  // are byte tokens here, which random weights pick often enough to end replies after a token.
  fs.writeFileSync(path.join(outDir, 'config.json'), JSON.stringify({ ...config, eos_token_id: 2 }, null, 2));

  const vocabMap = {};
  const added = [];
  const special = (id, content) => ({ id, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true });
  specials.forEach((s, id) => {
    vocabMap[s] = id;
    added.push(special(id, s));
  });
  byteSymbols().forEach((s, b) => {
    vocabMap[s] = specials.length + b;
  });
  for (let id = specials.length + 256; id < vocab; ++id) {
    const s = `<|reserved_${id}|>`;
    vocabMap[s] = id;
    added.push(special(id, s));
  }
  const tinyTokenizer = JSON.parse(fs.readFileSync(path.join(tiny, 'tokenizer.json'), 'utf8'));
  const tokenizer = {
    version: '1.0',
    truncation: null,
    padding: null,
    added_tokens: added,
    normalizer: tinyTokenizer.normalizer,
    pre_tokenizer: tinyTokenizer.pre_tokenizer,
    post_processor: tinyTokenizer.post_processor,
    decoder: tinyTokenizer.decoder,
    model: { ...tinyTokenizer.model, vocab: vocabMap, merges: [] },
  };
  fs.writeFileSync(path.join(outDir, 'tokenizer.json'), JSON.stringify(tokenizer));

  const tokenizerConfig = JSON.parse(fs.readFileSync(path.join(tiny, 'tokenizer_config.json'), 'utf8'));
  tokenizerConfig.added_tokens_decoder = Object.fromEntries(added.map((t) => [String(t.id), t]));
  fs.writeFileSync(path.join(outDir, 'tokenizer_config.json'), JSON.stringify(tokenizerConfig, null, 2));
  fs.writeFileSync(path.join(outDir, 'generation_config.json'), JSON.stringify({ eos_token_id: 2, pad_token_id: 0 }, null, 2));
  return outDir;
}

if (process.argv[1] && path.resolve(process.argv[1]) === path.resolve(new URL(import.meta.url).pathname)) {
  const [family, outDir] = process.argv.slice(2);
  if (!family || !outDir) {
    console.error('usage: node random_model.mjs gpt_oss|deepseek_v3|glm4_moe OUT_DIR');
    process.exit(2);
  }
  writeRandomModel(family, outDir);
  console.log(outDir);
}
