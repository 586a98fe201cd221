// Concurrency: identical greedy streams agree with each other and with the non-streamed answer;
// a client that goes away frees its KV blocks; 200 requests from 32 clients all complete and
// leave the KV pool empty. KV usage and running/waiting counts are read from /metrics.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';

import { ANTHROPIC_MODEL, kvUsage, openaiStreamText, pool, requestsRunning, startServer } from './helpers.mjs';

const CHAT = [{ role: 'user', content: 'Write a Python class for a stack with push, pop and peek.' }];
const CODE = 'class LRUCache:\n    """A least-recently-used cache with a fixed capacity."""\n\n    def __init__(self, capacity):\n';

let srv;
let model;
let contextLen;

before(async () => {
  srv = await startServer();
  model = await srv.modelId();
  const entry = (await srv.get('/v1/models')).json.data[0];
  contextLen = entry.max_model_len ?? entry.context_length ?? entry.context_window ?? entry.max_context_length ?? 2048;
});
after(() => srv?.stop());

describe('identical greedy requests', () => {
  test('12 concurrent greedy streams of the same request return identical text, equal to the non-streamed response', { timeout: 180_000 }, async () => {
    const req = { model, messages: CHAT, max_tokens: 24, temperature: 0 };
    const ref = await srv.post('/v1/chat/completions', req);
    assert.equal(ref.status, 200, `reference request: ${ref.status} ${ref.text.slice(0, 300)}`);
    const expected = ref.json.choices[0].message.content;

    const streams = await Promise.all(Array.from({ length: 12 }, () => srv.stream('/v1/chat/completions', { ...req, stream: true })));
    const texts = streams.map((s, i) => {
      assert.equal(s.status, 200, `stream ${i}: HTTP ${s.status} ${s.text}`);
      assert.equal(s.events.at(-1)?.data, '[DONE]', `stream ${i} must end with [DONE]`);
      return openaiStreamText(s.events.slice(0, -1).map((e) => e.json));
    });
    const differing = texts.map((t, i) => [i, t.length > 80 ? `${t.slice(0, 80)}...` : t]).filter(([i]) => texts[i] !== expected);
    assert.deepEqual(
      differing,
      [],
      `all 12 concurrent streams must equal the non-streamed greedy text ${JSON.stringify(expected)}; these differ: ${JSON.stringify(differing)}`,
    );
    await srv.waitIdle({ what: 'after 12 concurrent streams' });
  });
});

describe('clients that go away', () => {
  // Starts a long generation and resolves once `n` content events have arrived.
  function startLongStream(path, body, n, headers = {}) {
    const controller = new AbortController();
    let seen = 0;
    let resolveStarted;
    const started = new Promise((r) => {
      resolveStarted = r;
    });
    const done = srv.stream(path, body, {
      headers,
      signal: controller.signal,
      onEvent: () => {
        seen += 1;
        if (seen === n) resolveStarted();
      },
    });
    done.then((r) => resolveStarted(r), () => resolveStarted());
    return { controller, started, done, seen: () => seen };
  }

  const longTokens = () => Math.max(64, Math.min(2000, contextLen - 128));

  test('aborting a stream mid-generation frees its KV blocks: usage and running return to 0 (/metrics)', { timeout: 120_000 }, async () => {
    await srv.waitIdle({ what: 'before the stream' });
    const s = startLongStream('/v1/completions', { model, prompt: CODE, max_tokens: longTokens(), temperature: 0, stream: true, ignore_eos: true }, 4);
    await s.started;
    const finishedEarly = await Promise.race([s.done.then(() => true), sleep(50).then(() => false)]);
    assert.ok(!finishedEarly, `the long stream ended by itself after ${s.seen()} events; it must still be running to test a disconnect`);

    const during = await srv.metrics();
    const kvDuring = kvUsage(during);
    const runningDuring = requestsRunning(during);
    assert.ok(kvDuring.value > 0, `while a request generates, ${kvDuring.name} must be > 0, got ${kvDuring.value}`);
    assert.ok(runningDuring.value >= 1, `while a request generates, ${runningDuring.name} must be >= 1, got ${runningDuring.value}`);

    s.controller.abort();
    await s.done.catch(() => {});
    const idle = await srv.waitIdle({ timeoutMs: 5_000, what: 'after the client aborted its stream' });
    assert.equal(idle.kv.value, 0);

    const ok = await srv.post('/v1/completions', { model, prompt: CODE, max_tokens: 2 });
    assert.equal(ok.status, 200, `the server keeps serving after a disconnect: ${ok.status} ${ok.text.slice(0, 200)}`);
  });

  test('aborting several streams at once (chat and Messages API) frees every block', { timeout: 120_000 }, async () => {
    await srv.waitIdle({ what: 'before the streams' });
    const n = longTokens();
    const streams = [
      startLongStream('/v1/chat/completions', { model, messages: CHAT, max_tokens: n, temperature: 0, stream: true, ignore_eos: true }, 4),
      startLongStream('/v1/completions', { model, prompt: CODE, max_tokens: n, temperature: 0.8, seed: 7, stream: true, ignore_eos: true }, 4),
      startLongStream('/v1/messages', { model: ANTHROPIC_MODEL, messages: CHAT, max_tokens: n, temperature: 0, stream: true }, 6, { 'anthropic-version': '2023-06-01' }),
    ];
    await Promise.all(streams.map((s) => s.started));
    const running = requestsRunning(await srv.metrics());
    for (const s of streams) s.controller.abort();
    await Promise.all(streams.map((s) => s.done.catch(() => {})));
    assert.ok(running.value >= 1, `${running.name} while three streams generate: ${running.value}`);
    await srv.waitIdle({ timeoutMs: 5_000, what: 'after three clients aborted their streams' });
  });

  test('a non-streaming request abandoned by its client is cancelled and frees its blocks', { timeout: 120_000 }, async () => {
    await srv.waitIdle({ what: 'before the request' });
    const controller = new AbortController();
    const req = srv.post('/v1/completions', { model, prompt: CODE, max_tokens: longTokens(), temperature: 0, ignore_eos: true }, { signal: controller.signal });
    const deadline = Date.now() + 20_000;
    let running = 0;
    while (Date.now() < deadline && running === 0) {
      running = requestsRunning(await srv.metrics()).value;
      if (running === 0) await sleep(50);
    }
    assert.ok(running >= 1, 'the request never showed up as running in /metrics');
    await sleep(300);
    controller.abort();
    await req.catch(() => {});
    // docs/API.md: a non-streaming reply keeps the connection alive with a space every 2 s; the
    // write that fails is how the server notices the client left.
    await srv.waitIdle({ timeoutMs: 8_000, what: 'after the client abandoned a non-streaming request' });
  });
});

describe('load', () => {
  test('200 requests from 32 concurrent clients all complete; afterwards the KV pool is empty and nothing runs or waits', { timeout: 300_000 }, async (t) => {
    const client = srv.openai();
    const anthropic = srv.anthropic();
    const items = Array.from({ length: 200 }, (_, i) => i);
    const failures = [];
    const t0 = Date.now();
    await pool(items, 32, async (i) => {
      const content = `Write a Python function number ${i} that returns ${i} squared plus ${i % 7}.`;
      const maxTokens = 4 + (i % 9);
      try {
        switch (i % 4) {
          case 0: {
            const r = await client.chat.completions.create({ model, messages: [{ role: 'user', content }], max_tokens: maxTokens });
            assert.equal(typeof r.choices[0].message.content, 'string');
            assert.ok(r.usage.completion_tokens >= 1 && r.usage.completion_tokens <= maxTokens, `completion_tokens ${r.usage.completion_tokens}`);
            break;
          }
          case 1: {
            const s = await srv.stream('/v1/chat/completions', { model, messages: [{ role: 'user', content }], max_tokens: maxTokens, stream: true, stream_options: { include_usage: true } });
            assert.equal(s.status, 200, `HTTP ${s.status} ${s.text}`);
            assert.equal(s.events.at(-1)?.data, '[DONE]', 'stream ends with [DONE]');
            assert.ok(s.events.at(-2)?.json?.usage?.completion_tokens >= 1, 'usage chunk');
            break;
          }
          case 2: {
            const r = await client.completions.create({ model, prompt: `def f_${i}(x):\n`, max_tokens: maxTokens, temperature: 0.7 });
            assert.equal(typeof r.choices[0].text, 'string');
            break;
          }
          default: {
            const m = await anthropic.messages.create({ model: ANTHROPIC_MODEL, max_tokens: maxTokens, messages: [{ role: 'user', content }] });
            assert.equal(m.type, 'message');
            assert.ok(m.usage.output_tokens >= 1 && m.usage.output_tokens <= maxTokens, `output_tokens ${m.usage.output_tokens}`);
          }
        }
      } catch (e) {
        failures.push(`request ${i} (kind ${i % 4}): ${e.status ?? ''} ${e.message.split('\n')[0]}`);
      }
    });
    const seconds = (Date.now() - t0) / 1000;
    assert.deepEqual(failures, [], `all 200 requests must succeed; ${failures.length} failed:\n${failures.slice(0, 20).join('\n')}\n${srv.diagnostics(20)}`);
    const idle = await srv.waitIdle({ timeoutMs: 10_000, what: 'after 200 requests' });
    assert.equal(idle.running.value, 0);
    assert.equal(idle.waiting.value, 0);
    t.diagnostic(`200 requests from 32 clients took ${seconds.toFixed(1)} s`);
  });
});
