// Back-pressure: with --max-seqs 1 and (when the server has one) a waiting-queue limit of 1, a
// third concurrent request is refused with 429 or 503 in the API's error shape, the server
// recovers once the queue drains, and no more than --max-seqs requests ever run at once.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';

import { ANTHROPIC_MODEL, assertAnthropicError, assertOpenAIError, findServeFlag, pool, requestsRunning, requestsWaiting, startServer } from './helpers.mjs';

const CHAT = [{ role: 'user', content: 'Write a Python module that parses CSV files.' }];
// A waiting-queue limit flag, if `spill serve --help` lists one.
const QUEUE_FLAG = findServeFlag(/^--(max-(waiting|queue|queued|pending)|queue-(size|limit|len|depth)|max-num-waiting)/);

let srv;
let model;

before(async () => {
  srv = await startServer({ args: ['--max-seqs', 1, ...(QUEUE_FLAG ? [QUEUE_FLAG, 1] : [])] });
  model = await srv.modelId();
});
after(() => srv?.stop());

async function waitMetric(read, want, what, timeoutMs = 20_000) {
  const deadline = Date.now() + timeoutMs;
  let g;
  while (Date.now() < deadline) {
    g = read(await srv.metrics());
    if (g.value >= want) return g;
    await sleep(50);
  }
  assert.fail(`${what}: ${g?.name} stayed at ${g?.value}, expected >= ${want} within ${timeoutMs} ms`);
}

function startLong() {
  const controller = new AbortController();
  const done = srv.stream('/v1/chat/completions', { model, messages: CHAT, max_tokens: 1000, temperature: 0, stream: true, ignore_eos: true }, { signal: controller.signal }).catch(() => null);
  return { controller, done };
}

describe('waiting-queue limit', () => {
  test('with one running and one waiting, the next request is refused with 429 or 503 (OpenAI and Anthropic shapes), then the server recovers', { timeout: 120_000 }, async (t) => {
    if (!QUEUE_FLAG) assert.fail('`spill serve --help` lists no waiting-queue limit flag (looked for --max-waiting, --max-queue..., --queue-size...)');
    t.diagnostic(`queue limit flag: ${QUEUE_FLAG} 1`);
    const a = startLong();
    await waitMetric(requestsRunning, 1, 'first long request running');
    const b = startLong();
    await waitMetric(requestsWaiting, 1, 'second long request waiting');
    try {
      const r = await srv.post('/v1/chat/completions', { model, messages: CHAT, max_tokens: 4 });
      assert.ok([429, 503].includes(r.status), `queue full: expected 429 or 503, got ${r.status}: ${r.text.slice(0, 300)}`);
      assertOpenAIError(r, r.status, 'queue full (chat completions)');
      const retry = r.headers.get('retry-after');
      if (retry !== null) assert.match(retry, /^\d+$/, `Retry-After, when sent, is a number of seconds: ${retry}`);

      const s = await srv.post('/v1/chat/completions', { model, messages: CHAT, max_tokens: 4, stream: true });
      assert.ok([429, 503].includes(s.status), `queue full, streaming request: expected 429 or 503 before any event, got ${s.status}: ${s.text.slice(0, 300)}`);

      const m = await srv.post('/v1/messages', { model: ANTHROPIC_MODEL, messages: CHAT, max_tokens: 4 }, { headers: { 'anthropic-version': '2023-06-01' } });
      assert.ok([429, 503, 529].includes(m.status), `queue full (Messages API): expected 429, 503 or 529, got ${m.status}: ${m.text.slice(0, 300)}`);
      const e = assertAnthropicError(m, m.status, undefined, 'queue full (Messages API)');
      assert.ok(['rate_limit_error', 'overloaded_error', 'api_error'].includes(e.type), `Messages API queue-full error.type: ${e.type}`);
    } finally {
      a.controller.abort();
      b.controller.abort();
      await Promise.all([a.done, b.done]);
    }
    await srv.waitIdle({ timeoutMs: 10_000, what: 'after the long requests were aborted' });
    const ok = await srv.post('/v1/chat/completions', { model, messages: CHAT, max_tokens: 4 });
    assert.equal(ok.status, 200, `once the queue drained, requests are served again: ${ok.status} ${ok.text.slice(0, 300)}`);
  });
});

describe('flood', () => {
  test('48 concurrent requests against --max-seqs 1: each is served (200) or refused (429/503), never more than 1 running', { timeout: 240_000 }, async (t) => {
    let maxRunning = 0;
    let sampling = true;
    const sampler = (async () => {
      while (sampling) {
        maxRunning = Math.max(maxRunning, requestsRunning(await srv.metrics()).value);
        await sleep(50);
      }
    })();
    const results = await pool(
      Array.from({ length: 48 }, (_, i) => i),
      48,
      (i) => srv.post('/v1/chat/completions', { model, messages: [{ role: 'user', content: `Task ${i}: write a Python function.` }], max_tokens: 8 }),
    );
    sampling = false;
    await sampler;
    const counts = {};
    for (const r of results) counts[r.status] = (counts[r.status] ?? 0) + 1;
    t.diagnostic(`statuses: ${JSON.stringify(counts)}; most running at once: ${maxRunning}`);
    for (const [i, r] of results.entries()) {
      if (r.status === 200) continue;
      assert.ok([429, 503].includes(r.status), `request ${i}: expected 200, 429 or 503, got ${r.status}: ${r.text.slice(0, 300)}`);
      assertOpenAIError(r, r.status, `request ${i} refused`);
    }
    assert.ok((counts[200] ?? 0) >= 1, 'at least one request is served');
    if (QUEUE_FLAG) assert.ok((counts[429] ?? 0) + (counts[503] ?? 0) >= 1, `with ${QUEUE_FLAG} 1, 48 concurrent requests must overflow the queue`);
    assert.ok(maxRunning <= 1, `--max-seqs 1: ${maxRunning} requests were running at once`);
    await srv.waitIdle({ timeoutMs: 10_000, what: 'after the flood' });
  });
});
