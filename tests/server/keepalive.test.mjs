// Keep-alive while a stream has nothing to say yet (a long prefill, or a wait in the queue):
// each API gets events its clients count as activity, not SSE comments (which one agent's 240 s
// idle timer did not see): chat and text completions get empty chunks (data lines the SDK yields),
// the Messages API its `ping` event, the Responses API `response.in_progress` events. The wait
// is made certain by queueing: with --max-seqs 1, a long request holds the only slot while the
// stream under test waits for it.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';

import { ANTHROPIC_MODEL, RANDOM_MODEL, startServer } from './helpers.mjs';

const PING_S = 0.05;
let srv;
let model;

before(async () => {
  srv = await startServer({ args: ['--max-seqs', 1, '--ping-interval', PING_S] });
  model = await srv.modelId();
});
after(() => srv?.stop());

// Runs `streamed()` while a long request holds the only sequence slot; returns its events and how
// long the blocker ran. The blocker's client goes away after HOLD_MS (the server then ends it), so the
// wait lasts about that long however fast the model is: spill-tiny makes 1000 tokens in ~1 s, a tiny
// random family model in ~0.1 s, which was too short a wait to test.
const HOLD_MS = 600;
async function whileBlocked(streamed) {
  const t0 = performance.now();
  const release = new AbortController();
  const blocker = srv.stream('/v1/completions', { model, prompt: 'def main():\n', max_tokens: 100000, temperature: 0, ignore_eos: true, stream: true },
    { signal: release.signal });
  await new Promise((r) => setTimeout(r, 50));  // the blocker is admitted first
  const letGo = setTimeout(() => release.abort(), HOLD_MS);
  const out = await streamed();
  clearTimeout(letGo);
  release.abort();
  const b = await blocker;
  assert.equal(b.status, 200, b.text);
  return { ...out, blockedMs: performance.now() - t0 };
}

// Events before the first one that carries generated text. The wait must be long enough to
// matter (the blocker holds the slot), and a keep-alive must come at least every 250 ms of it
// (--ping-interval 0.05 s; the pump looks every 100 ms). Null (the test skipped) when a random-weight
// model's reply has no visible text at all (bytes that never make a character, reserved tokens).
function beforeFirstText(t, events, hasText, isKeepalive) {
  const i = events.findIndex(hasText);
  if (i < 0 && RANDOM_MODEL) {
    t.skip("a random-weight model's reply had no visible text to wait for");
    return null;
  }
  assert.ok(i > 0, `some text arrived: ${events.map((e) => e.data.slice(0, 80)).join(' | ')}`);
  const waitedMs = events[i].t;
  assert.ok(waitedMs >= 250, `the stream waited ${waitedMs} ms for the blocker: too short to test keep-alives`);
  const early = events.slice(0, i);
  const n = early.filter(isKeepalive).length;
  assert.ok(n >= Math.floor(waitedMs / 250), `${n} keep-alive events in ${Math.round(waitedMs)} ms of waiting`);
  return early;
}

describe('keep-alive events during a wait', () => {
  test('chat completions: empty-delta chunks before the first token, which the openai SDK yields', async (t) => {
    const { events } = await whileBlocked(() => srv.stream('/v1/chat/completions', { model, messages: [{ role: 'user', content: 'Hello' }], max_tokens: 8, temperature: 0, stream: true }));
    const early = beforeFirstText(t, events, (e) => e.json?.choices?.[0]?.delta?.content, (e) => e.json?.object === 'chat.completion.chunk');
    if (!early) return;
    for (const e of early) {
      assert.equal(e.json.object, 'chat.completion.chunk', e.data);
      assert.equal(e.json.choices[0].finish_reason, null);
      assert.ok(!e.json.choices[0].delta.content && !e.json.choices[0].delta.tool_calls, `no text in a keep-alive: ${e.data}`);
    }
    assert.equal(early[0].json.choices[0].delta.role, 'assistant', 'the first chunk carries the role, as OpenAI streams open');
    // The SDK iterates them without trouble and assembles the same text.
    const { sdkText, plain } = await whileBlocked(async () => {
      const stream = await srv.openai().chat.completions.create({ model, messages: [{ role: 'user', content: 'Hello' }], max_tokens: 8, temperature: 0, stream: true });
      let sdkText = '';
      for await (const chunk of stream) sdkText += chunk.choices[0]?.delta?.content ?? '';
      return { sdkText };
    }).then(async (r) => ({ ...r, plain: await srv.openai().chat.completions.create({ model, messages: [{ role: 'user', content: 'Hello' }], max_tokens: 8, temperature: 0 }) }));
    assert.equal(sdkText, plain.choices[0].message.content);
  });

  test('text completions: empty text chunks', async (t) => {
    const { events } = await whileBlocked(() => srv.stream('/v1/completions', { model, prompt: 'def add(a, b):', max_tokens: 8, temperature: 0, stream: true }));
    const early = beforeFirstText(t, events, (e) => e.json?.choices?.[0]?.text, (e) => e.json?.object === 'text_completion');
    if (!early) return;
    for (const e of early) assert.equal(e.json.choices[0].text, '', e.data);
  });

  test('Messages API: ping events', async (t) => {
    const { events } = await whileBlocked(() => srv.stream('/v1/messages', { model: ANTHROPIC_MODEL, max_tokens: 8, messages: [{ role: 'user', content: 'Hello' }], stream: true }, { headers: { 'anthropic-version': '2023-06-01' } }));
    const early = beforeFirstText(t, events, (e) => e.event === 'content_block_start' || e.event === 'content_block_delta', (e) => e.event === 'ping');
    if (!early) return;
    assert.equal(early[0].event, 'message_start');
    const pings = early.filter((e) => e.event === 'ping');
    for (const p of pings) assert.deepEqual(p.json, { type: 'ping' });
  });

  test('Responses API: response.in_progress events, numbered in sequence', async (t) => {
    const { events } = await whileBlocked(() => srv.stream('/v1/responses', { model, input: 'Hello', max_output_tokens: 8, temperature: 0, stream: true }));
    const early = beforeFirstText(t, events, (e) => e.event === 'response.output_item.added', (e) => e.event === 'response.in_progress');
    if (!early) return;
    assert.equal(early[0].event, 'response.created');
    events.forEach((e, i) => assert.equal(e.json.sequence_number, i));
  });
});
