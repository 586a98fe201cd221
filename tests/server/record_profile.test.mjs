// spill serve --record-profile: routing counts of live traffic land in the profile file while the
// server runs (rewritten every interval) and once more at shutdown; every routed token is counted
// top_k times, prompt tokens as prefill and fed-back sampled tokens as decode.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, before, test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';

import { startServer } from './helpers.mjs';

const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'spill-profile-'));
const file = path.join(dir, 'profile.json');
let srv;

before(async () => {
  srv = await startServer({ args: ['--record-profile', file, '--record-profile-interval', 0.2] });
});
after(async () => {
  await srv?.stop();
  fs.rmSync(dir, { recursive: true, force: true });
});

function readProfile() {
  const p = JSON.parse(fs.readFileSync(file, 'utf8'));
  assert.equal(p.format, 'spill-routing-profile');
  return p;
}

test('live traffic is counted, rewritten while serving and at shutdown', async () => {
  const runs = [];
  for (const [prompt, max_tokens] of [['def add(a, b):\n', 5], ['import os\n\nclass Config:\n', 9]]) {
    const r = await srv.post('/v1/completions', { prompt, max_tokens, temperature: 0, ignore_eos: true });
    assert.equal(r.status, 200, r.text);
    runs.push(r.json.usage);
  }
  const prompt = runs.reduce((s, u) => s + u.prompt_tokens, 0);
  const decode = runs.reduce((s, u) => s + u.completion_tokens - 1, 0);  // the last sampled token is never fed back
  // The file is rewritten every 0.2 s while the server runs.
  let p;
  const deadline = Date.now() + 10_000;
  do {
    await sleep(100);
    p = readProfile();
    // Every MoE layer, not only the first: a snapshot can fall between two layers of one step, and
    // a model's first layer may be dense (GLM-4.x, DeepSeek-V3).
  } while (p.layers.some((l) => l.moe && l.decode_tokens < decode) && Date.now() < deadline);
  for (const layer of p.layers) {
    if (!layer.moe) continue;
    assert.equal(layer.prefill_tokens, prompt, `layer ${layer.layer} prefill tokens`);
    assert.equal(layer.decode_tokens, decode, `layer ${layer.layer} decode tokens`);
    assert.equal(layer.prefill.reduce((a, b) => a + b, 0), prompt * p.top_k);
    assert.equal(layer.decode.reduce((a, b) => a + b, 0), decode * p.top_k);
  }
  const steps = p.steps;
  const exit = await srv.stop();
  assert.equal(exit.code ?? 0, 0);
  assert.equal(readProfile().steps, steps, 'the final write holds the same counts');
});
