// Every request error on the OpenAI endpoints is a 4xx with the OpenAI shape
// {"error": {"message", "type", "param", "code"}}: malformed JSON, wrong types, out-of-range
// values, context length exceeded (server started with --max-model-len 256), bodies over the limit.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';

import OpenAI from 'openai';

import { ANTHROPIC_MODEL, assertAnthropicError, assertNamesField, assertOpenAIError, rawPost, startServer } from './helpers.mjs';

const MAX_MODEL_LEN = 256;
const CHAT = [{ role: 'user', content: 'Write a Python function that sorts a list.' }];

let srv;
let model;

before(async () => {
  srv = await startServer({ args: ['--max-model-len', MAX_MODEL_LEN] });
  model = await srv.modelId();
});
after(() => srv?.stop());

describe('malformed and mistyped requests', () => {
  test('malformed JSON: 400 with the OpenAI error shape', async () => {
    for (const path of ['/v1/chat/completions', '/v1/completions']) {
      for (const body of ['{"model": "x", "messages": [', 'not json at all', '']) {
        const r = await srv.post(path, body, { headers: { 'content-type': 'application/json' } });
        assertOpenAIError(r, 400, `${path} with body ${JSON.stringify(body)}`);
      }
    }
  });

  test('wrong types: 400 naming the field', async () => {
    const chat = { model, messages: CHAT, max_tokens: 4 };
    const cases = [
      ['temperature "hot"', { ...chat, temperature: 'hot' }, 'temperature'],
      ['messages not an array', { ...chat, messages: 'hello' }, 'messages'],
      ['messages missing', { model, max_tokens: 4 }, 'messages'],
      ['messages empty', { ...chat, messages: [] }, 'messages'],
      ['message without role', { ...chat, messages: [{ content: 'hi' }] }, 'role'],
      ['max_tokens "eight"', { ...chat, max_tokens: 'eight' }, 'max_tokens'],
      ['max_tokens 2.5', { ...chat, max_tokens: 2.5 }, 'max_tokens'],
      ['top_p []', { ...chat, top_p: [] }, 'top_p'],
      ['stream "yes"', { ...chat, stream: 'yes' }, 'stream'],
      ['stop 42', { ...chat, stop: 42 }, 'stop'],
    ];
    for (const [what, body, field] of cases) {
      const e = assertOpenAIError(await srv.post('/v1/chat/completions', body), 400, `chat ${what}`);
      assertNamesField(e, field, `chat ${what}`);
    }
    const e = assertOpenAIError(await srv.post('/v1/completions', { model, prompt: { text: 'x' }, max_tokens: 4 }), 400, 'completions prompt as an object');
    assertNamesField(e, 'prompt', 'completions prompt as an object');
    const body = JSON.stringify(['an', 'array']);
    assertOpenAIError(await srv.post('/v1/chat/completions', body), 400, 'chat body is a JSON array, not an object');
  });

  test('out-of-range values: 400 naming the field', async () => {
    const chat = { model, messages: CHAT, max_tokens: 4 };
    const cases = [
      ['temperature -1', { ...chat, temperature: -1 }, 'temperature'],
      ['top_p 2', { ...chat, top_p: 2 }, 'top_p'],
      ['top_p -0.5', { ...chat, top_p: -0.5 }, 'top_p'],
      ['max_tokens -5', { ...chat, max_tokens: -5 }, 'max_tokens'],
      ['max_completion_tokens -5', { model, messages: CHAT, max_completion_tokens: -5 }, 'max_completion_tokens'],
    ];
    for (const [what, body, field] of cases) {
      const e = assertOpenAIError(await srv.post('/v1/chat/completions', body), 400, `chat ${what}`);
      assertNamesField(e, field, `chat ${what}`);
    }
    for (const [what, extra, field] of [
      ['temperature -1', { temperature: -1 }, 'temperature'],
      ['max_tokens -5', { max_tokens: -5 }, 'max_tokens'],
    ]) {
      const e = assertOpenAIError(await srv.post('/v1/completions', { model, prompt: 'def f():', max_tokens: 4, ...extra }), 400, `completions ${what}`);
      assertNamesField(e, field, `completions ${what}`);
    }
  });

  test('the openai SDK surfaces a 400 as BadRequestError', async () => {
    const client = srv.openai();
    await assert.rejects(client.chat.completions.create({ model, messages: CHAT, max_tokens: 4, top_p: 2 }), (e) => {
      assert.ok(e instanceof OpenAI.BadRequestError, `expected BadRequestError, got ${e?.constructor?.name}: ${e?.message}`);
      assert.equal(e.status, 400);
      assert.equal(typeof e.error?.message, 'string', `SDK error body: ${JSON.stringify(e.error)}`);
      return true;
    });
  });

  test('unknown route: 404', async () => {
    const r = await srv.post('/v1/no-such-endpoint', { model });
    assert.equal(r.status, 404, `POST /v1/no-such-endpoint: expected 404, got ${r.status}`);
  });
});

describe('context length (server started with --max-model-len 256)', () => {
  // A completions prompt of about `target` tokens (no chat template), and its exact token count.
  async function promptOfAbout(target) {
    const unit = 'value = compute(value, 3)\n';
    const count = async (text) => {
      const r = await srv.post('/v1/completions', { model, prompt: text, max_tokens: 1, temperature: 0 });
      assert.equal(r.status, 200, `calibration request: ${r.status} ${r.text.slice(0, 300)}`);
      return r.json.usage.prompt_tokens;
    };
    const one = await count(unit);
    const perUnit = (await count(unit.repeat(5))) - one;
    assert.ok(perUnit > 0, 'calibration: more text must mean more prompt tokens');
    let n = Math.max(1, Math.floor(((target - one) * 4) / perUnit) + 1);
    let text = unit.repeat(n);
    let tokens = await count(text);
    while (tokens > target && n > 1) {
      n -= 1;
      text = unit.repeat(n);
      tokens = await count(text);
    }
    return { text, tokens };
  }

  test('max_tokens beyond the room the prompt leaves is a ceiling: clamped to the room, ending with length / max_tokens', async () => {
    const { text, tokens } = await promptOfAbout(MAX_MODEL_LEN - 12);
    assert.ok(tokens <= MAX_MODEL_LEN - 6 && tokens >= MAX_MODEL_LEN - 40, `calibration landed at ${tokens} prompt tokens`);
    const room = MAX_MODEL_LEN - tokens;

    // Agents send 32000 or 128000 whatever the context (Qwen Code, Claude Code).
    const over = await srv.post('/v1/completions', { model, prompt: text, max_tokens: 128000, temperature: 0, ignore_eos: true });
    assert.equal(over.status, 200, `prompt ${tokens} + max_tokens 128000 must be clamped, got ${over.status}: ${over.text.slice(0, 300)}`);
    assert.equal(over.json.usage.prompt_tokens, tokens, 'prompt tokens');
    assert.equal(over.json.usage.completion_tokens, room, `clamped to the ${room} tokens the prompt leaves`);
    assert.equal(over.json.choices[0].finish_reason, 'length');

    const chat = await srv.post('/v1/chat/completions', { model, messages: [{ role: 'user', content: text.slice(0, text.length / 2) }], max_tokens: 32000, temperature: 0, ignore_eos: true });
    assert.equal(chat.status, 200, `chat: ${chat.status} ${chat.text.slice(0, 300)}`);
    assert.equal(chat.json.usage.prompt_tokens + chat.json.usage.completion_tokens, MAX_MODEL_LEN, `chat fills the context exactly: ${JSON.stringify(chat.json.usage)}`);
    assert.equal(chat.json.choices[0].finish_reason, 'length');

    // Messages API (no ignore_eos there): 200, and never past the context.
    const m = await srv.post('/v1/messages', { model: ANTHROPIC_MODEL, max_tokens: 128000, temperature: 0, messages: [{ role: 'user', content: text.slice(0, text.length / 2) }] }, { headers: { 'anthropic-version': '2023-06-01' } });
    assert.equal(m.status, 200, `messages: ${m.status} ${m.text.slice(0, 300)}`);
    const used = m.json.usage.input_tokens + (m.json.usage.cache_read_input_tokens ?? 0) + m.json.usage.output_tokens;
    assert.ok(used <= MAX_MODEL_LEN, `messages: ${used} tokens used > ${MAX_MODEL_LEN}`);
    assert.ok(['end_turn', 'max_tokens'].includes(m.json.stop_reason), `stop_reason ${m.json.stop_reason}`);
    if (m.json.stop_reason === 'max_tokens') assert.equal(used, MAX_MODEL_LEN, 'max_tokens: the context is full');
  });

  test('a prompt longer than the context on its own: 400 context_length_exceeded (also streaming, also Messages API)', async () => {
    const text = 'value = compute(value, 3)\n'.repeat(200);
    for (const stream of [false, true]) {
      const r = await srv.post('/v1/chat/completions', { model, messages: [{ role: 'user', content: text }], max_tokens: 4, stream });
      const e = assertOpenAIError(r, 400, `chat prompt far over the limit (stream ${stream})`);
      assert.equal(e.code, 'context_length_exceeded', `error.code: ${JSON.stringify(e)}`);
      // Both numbers: the limit and what the prompt took.
      assert.match(e.message, new RegExp(`maximum context length is ${MAX_MODEL_LEN} tokens and the prompt alone is \\d+ tokens`), e.message);
    }
    const noMax = await srv.post('/v1/completions', { model, prompt: text });
    assert.equal(assertOpenAIError(noMax, 400, 'completions prompt over the limit, no max_tokens').code, 'context_length_exceeded');

    const m = await srv.post('/v1/messages', { model: ANTHROPIC_MODEL, max_tokens: 4, messages: [{ role: 'user', content: text }] }, { headers: { 'anthropic-version': '2023-06-01' } });
    assertAnthropicError(m, 400, 'invalid_request_error', 'Messages API prompt over the limit');
  });

  test('GET /v1/models reports the configured context length', async () => {
    const r = await srv.get('/v1/models');
    const entry = r.json?.data?.[0] ?? {};
    const len = entry.max_model_len ?? entry.context_length ?? entry.context_window ?? entry.max_context_length;
    assert.equal(len, MAX_MODEL_LEN, `/v1/models context length field must be ${MAX_MODEL_LEN}: ${JSON.stringify(entry)}`);
  });
});

describe('body size limit', () => {
  // The default limit is 32 MiB (docs/API.md, --max-body-bytes); 40 MB is over it.
  test('a 40 MB body: 413, and the server keeps serving', async () => {
    const filler = 'x'.repeat(40 * 1000 * 1000);
    const body = Buffer.from(JSON.stringify({ model, messages: [{ role: 'user', content: filler }], max_tokens: 1 }));
    const r = await rawPost(srv.url, '/v1/chat/completions', { 'Content-Type': 'application/json' }, body);
    assert.equal(r.status, 413, `40 MB body: expected 413, got ${r.status}: ${r.head}\n${r.body.slice(0, 300)}`);
    if (r.body.trim().startsWith('{')) {
      const json = JSON.parse(r.body);
      assert.equal(typeof json.error?.message, 'string', `413 body, if JSON, is OpenAI-shaped: ${r.body.slice(0, 300)}`);
    }
    const ok = await srv.post('/v1/chat/completions', { model, messages: CHAT, max_tokens: 2 });
    assert.equal(ok.status, 200, `after the 413 the server still serves: ${ok.status} ${ok.text.slice(0, 300)}`);
  });
});

describe('--strict-max-tokens', () => {
  let strict;
  before(async () => {
    strict = await startServer({ args: ['--max-model-len', MAX_MODEL_LEN, '--strict-max-tokens'] });
  });
  after(() => strict?.stop());

  test('prompt + max_tokens over the limit: 400 context_length_exceeded naming both numbers; at the limit: 200', async () => {
    const prompt = 'def add(a, b):\n    return a + b\n';
    const probe = await strict.post('/v1/completions', { model, prompt, max_tokens: 1, temperature: 0 });
    assert.equal(probe.status, 200, `probe: ${probe.status} ${probe.text.slice(0, 300)}`);
    const tokens = probe.json.usage.prompt_tokens;
    const room = MAX_MODEL_LEN - tokens;
    const fits = await strict.post('/v1/completions', { model, prompt, max_tokens: room, temperature: 0 });
    assert.equal(fits.status, 200, `prompt ${tokens} + max_tokens ${room} = ${MAX_MODEL_LEN} fits: got ${fits.status}: ${fits.text.slice(0, 300)}`);
    const over = await strict.post('/v1/completions', { model, prompt, max_tokens: room + 1, temperature: 0 });
    const e = assertOpenAIError(over, 400, `prompt ${tokens} + max_tokens ${room + 1} > ${MAX_MODEL_LEN}`);
    assert.equal(e.code, 'context_length_exceeded', `error.code: ${JSON.stringify(e)}`);
    assert.match(e.message, new RegExp(`\\b${MAX_MODEL_LEN}\\b`), `the message should state the limit: ${e.message}`);
    assert.match(e.message, new RegExp(`\\b${room + 1}\\b`), `the message should state max_tokens: ${e.message}`);
    const chatOver = await strict.post('/v1/chat/completions', { model, messages: [{ role: 'user', content: prompt }], max_tokens: MAX_MODEL_LEN, temperature: 0 });
    assert.equal(assertOpenAIError(chatOver, 400, 'chat over the limit').code, 'context_length_exceeded');
  });
});
