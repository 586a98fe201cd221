// Time to first token with and without the prefix cache: for each prompt length, RUNS pairs of
// streamed chat requests, a cold one whose long system prompt no earlier request has seen and a
// warm one that shares it, and the medians of both. Prints a markdown table for docs/perf/.
//
// Usage (from the repository root; uses the test suite's helpers and its node_modules):
//   SPILL_BIN=build/spill node tools/bench/prefix_cache_ttft.mjs [runs] [prompt tokens ...]
//   e.g. SPILL_BIN=build/spill SPILL_TEST_MODEL=/models/X node tools/bench/prefix_cache_ttft.mjs 5 512 2048 8192
import { execSync } from 'node:child_process';
import os from 'node:os';

import { longCodePrefix, median, nonce, startServer } from '../../tests/server/helpers.mjs';

const runs = Number(process.argv[2] ?? 3);
const targets = process.argv.slice(3).map(Number);
if (targets.length === 0) targets.push(512, 1024);

const srv = await startServer();
try {
  const model = await srv.modelId();
  const entry = (await srv.get('/v1/models')).json.data[0];
  const contextLen = entry.max_model_len ?? entry.context_length ?? 2048;

  const promptTokens = async (lines) => {
    const r = await srv.post('/v1/completions', { model, prompt: longCodePrefix(lines, nonce()), max_tokens: 1 });
    if (r.status !== 200) throw new Error(`calibration: HTTP ${r.status} ${r.text.slice(0, 300)}`);
    return r.json.usage.prompt_tokens;
  };
  const a = await promptTokens(2);
  const perLine = ((await promptTokens(12)) - a) / 10;

  const timedChat = async (system, question) => {
    const start = performance.now();
    const r = await srv.stream('/v1/chat/completions', {
      model,
      messages: [{ role: 'system', content: system }, { role: 'user', content: question }],
      max_tokens: 2,
      temperature: 0,
      stream: true,
      stream_options: { include_usage: true },
    });
    if (r.status !== 200) throw new Error(`HTTP ${r.status}: ${r.text?.slice(0, 300)}`);
    const first = r.events.find((e) => e.json?.choices?.some((c) => (c.delta?.content ?? '') !== '' || c.finish_reason != null));
    const usage = r.events.find((e) => e.json?.usage)?.json.usage;
    return { ms: first?.t ?? performance.now() - start, usage };
  };

  const commit = (() => {
    try {
      return execSync('git rev-parse --short HEAD', { encoding: 'utf8' }).trim();
    } catch {
      return 'unknown';
    }
  })();
  console.log(`prefix cache TTFT, ${new Date().toISOString().slice(0, 10)}, ${os.cpus()[0]?.model ?? '?'} x${os.cpus().length}, commit ${commit}, ${runs} runs each, model ${model}`);
  console.log('');
  console.log('| prompt tokens | cached (warm) | cold TTFT ms (median) | warm TTFT ms (median) | speed-up |');
  console.log('|---:|---:|---:|---:|---:|');
  for (const target of targets) {
    if (target >= contextLen) {
      console.log(`| ${target} | - | skipped: context is ${contextLen} | | |`);
      continue;
    }
    const lines = Math.max(4, Math.floor((target - a) / perLine) + 2);
    const cold = [];
    const warm = [];
    for (let i = 0; i < runs; i++) {
      const system = longCodePrefix(lines, nonce());
      cold.push(await timedChat(system, `Question ${i}: what does item_3 return?`));
      warm.push(await timedChat(system, `Follow-up ${i}: and item_5?`));
    }
    const c = median(cold.map((x) => x.ms));
    const w = median(warm.map((x) => x.ms));
    const cached = warm[0].usage?.prompt_tokens_details?.cached_tokens ?? 0;
    console.log(`| ${cold[0].usage?.prompt_tokens} | ${cached} | ${c.toFixed(0)} | ${w.toFixed(0)} | ${(c / w).toFixed(1)}x |`);
  }
} finally {
  await srv.stop();
}
