// Anthropic Messages API through the official `@anthropic-ai/sdk` and raw HTTP: messages,
// streaming (SDK helper and the raw event sequence), stop_sequences, count_tokens, system
// prompts, tool-use plumbing, Anthropic-shaped errors.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';

import Anthropic from '@anthropic-ai/sdk';

import { ANTHROPIC_MODEL, assertAnthropicError, assertInt, pickStopString, RANDOM_MODEL, startServer } from './helpers.mjs';

const MESSAGES = [{ role: 'user', content: 'Write a Python function that checks whether a number is prime.' }];
const STOP_REASONS = ['end_turn', 'max_tokens', 'stop_sequence', 'tool_use'];
const HEADERS = { 'anthropic-version': '2023-06-01', 'x-api-key': 'sk-ant-spill-test' };

let srv;
let client;

before(async () => {
  srv = await startServer();
  client = srv.anthropic();
});
after(() => srv?.stop());

const textOf = (msg) => msg.content.filter((b) => b.type === 'text').map((b) => b.text).join('');
// The whole prompt: Anthropic's input_tokens counts only what was not read from the prefix cache.
const promptTokens = (usage) => usage.input_tokens + (usage.cache_read_input_tokens ?? 0) + (usage.cache_creation_input_tokens ?? 0);

function assertMessage(m, what, maxTokens) {
  assert.equal(m.type, 'message', `${what}: type`);
  assert.equal(m.role, 'assistant', `${what}: role`);
  assert.equal(typeof m.id, 'string', `${what}: id must be a string`);
  assert.ok(m.id.length > 0, `${what}: id must not be empty`);
  assert.equal(typeof m.model, 'string', `${what}: model must be a string`);
  assert.ok(Array.isArray(m.content), `${what}: content must be an array of blocks, got ${JSON.stringify(m.content)}`);
  for (const b of m.content) {
    assert.ok(['text', 'tool_use', 'thinking'].includes(b.type), `${what}: unexpected content block ${JSON.stringify(b)}`);
    if (b.type === 'text') assert.equal(typeof b.text, 'string', `${what}: text block needs text`);
  }
  assert.ok(STOP_REASONS.includes(m.stop_reason), `${what}: stop_reason must be one of ${STOP_REASONS}, got ${m.stop_reason}`);
  if (m.stop_reason !== 'stop_sequence') assert.equal(m.stop_sequence ?? null, null, `${what}: stop_sequence must be null unless stop_reason is stop_sequence`);
  assert.ok(m.usage && typeof m.usage === 'object', `${what}: usage must be present`);
  assertInt(m.usage.input_tokens, `${what}: usage.input_tokens`, { min: 0 });
  if (m.usage.cache_read_input_tokens != null) assertInt(m.usage.cache_read_input_tokens, `${what}: usage.cache_read_input_tokens`, { min: 0 });
  assert.ok(promptTokens(m.usage) >= 1, `${what}: input_tokens + cache_read_input_tokens must count the prompt: ${JSON.stringify(m.usage)}`);
  assertInt(m.usage.output_tokens, `${what}: usage.output_tokens`, { min: 0, max: maxTokens });
  if (m.stop_reason === 'max_tokens') assert.equal(m.usage.output_tokens, maxTokens, `${what}: stop_reason max_tokens means output_tokens == max_tokens`);
}

/**
 * Checks the raw event sequence of a Messages stream: message_start, then per block
 * content_block_start / content_block_delta... / content_block_stop, then message_delta
 * (stop_reason, usage), then message_stop; ping events may appear anywhere. Returns
 * {start, text, delta, blocks}.
 */
function checkEventSequence(events, what) {
  const seq = events.filter((e) => e.event !== 'ping' && e.json?.type !== 'ping');
  for (const e of seq) {
    assert.ok(e.json, `${what}: every event carries JSON data, got ${JSON.stringify(e.data)}`);
    assert.equal(e.event, e.json.type, `${what}: the SSE "event:" name must equal data.type (${JSON.stringify(e.data).slice(0, 200)})`);
  }
  const types = seq.map((e) => e.json.type);
  assert.equal(types[0], 'message_start', `${what}: the first event must be message_start, got ${types.join(' ')}`);
  assert.equal(types.at(-1), 'message_stop', `${what}: the last event must be message_stop, got ${types.join(' ')}`);
  assert.equal(types.at(-2), 'message_delta', `${what}: message_delta must come right before message_stop, got ${types.join(' ')}`);

  const start = seq[0].json.message;
  assert.equal(start?.type, 'message', `${what}: message_start.message.type`);
  assert.equal(start.role, 'assistant', `${what}: message_start.message.role`);
  assert.deepEqual(start.content, [], `${what}: message_start.message.content must be []`);
  assert.equal(start.stop_reason ?? null, null, `${what}: message_start.message.stop_reason must be null`);
  assertInt(start.usage?.input_tokens, `${what}: message_start usage.input_tokens`, { min: 1 });

  let text = '';
  const blocks = [];
  let open = null;
  for (const e of seq.slice(1, -2)) {
    const j = e.json;
    if (j.type === 'content_block_start') {
      assert.equal(open, null, `${what}: content_block_start while block ${open} is still open`);
      assert.equal(j.index, blocks.length, `${what}: content block indices count up from 0`);
      assert.ok(j.content_block && typeof j.content_block.type === 'string', `${what}: content_block_start needs content_block`);
      if (j.content_block.type === 'text') assert.equal(j.content_block.text, '', `${what}: a text block starts empty`);
      open = j.index;
      blocks.push(j.content_block.type);
    } else if (j.type === 'content_block_delta') {
      assert.equal(j.index, open, `${what}: content_block_delta for block ${j.index} while ${open} is open`);
      const kind = blocks[open];
      if (kind === 'text') {
        assert.equal(j.delta?.type, 'text_delta', `${what}: a text block gets text_delta deltas`);
        assert.equal(typeof j.delta.text, 'string', `${what}: text_delta.text`);
        text += j.delta.text;
      } else if (kind === 'tool_use') {
        assert.equal(j.delta?.type, 'input_json_delta', `${what}: a tool_use block gets input_json_delta deltas`);
      }
    } else if (j.type === 'content_block_stop') {
      assert.equal(j.index, open, `${what}: content_block_stop for block ${j.index} while ${open} is open`);
      open = null;
    } else {
      assert.fail(`${what}: unexpected event ${j.type} between message_start and message_delta (sequence: ${types.join(' ')})`);
    }
  }
  assert.equal(open, null, `${what}: a content block was never stopped`);
  assert.ok(blocks.length >= 1, `${what}: at least one content block expected (sequence: ${types.join(' ')})`);

  const delta = seq.at(-2).json;
  assert.ok(STOP_REASONS.includes(delta.delta?.stop_reason), `${what}: message_delta.delta.stop_reason must be one of ${STOP_REASONS}, got ${JSON.stringify(delta.delta)}`);
  assertInt(delta.usage?.output_tokens, `${what}: message_delta.usage.output_tokens`, { min: 0 });
  return { start, text, delta, blocks };
}

describe('messages', () => {
  test('non-streaming: content blocks, stop_reason, usage; any model name is accepted', async () => {
    const m = await client.messages.create({ model: ANTHROPIC_MODEL, max_tokens: 16, messages: MESSAGES, temperature: 0 });
    assertMessage(m, 'message', 16);
    assert.ok(m.content.some((b) => b.type === 'text'), `a text block expected, got ${JSON.stringify(m.content)}`);
    const other = await client.messages.create({ model: 'claude-3-5-haiku-latest', max_tokens: 4, messages: MESSAGES, temperature: 0 });
    assertMessage(other, 'another model name', 4);
  });

  test('stop_reason "max_tokens" when max_tokens is hit', async (t) => {
    const m = await client.messages.create({ model: ANTHROPIC_MODEL, max_tokens: 3, messages: MESSAGES, temperature: 0 });
    assertMessage(m, 'max_tokens=3', 3);
    if (RANDOM_MODEL && m.stop_reason === 'end_turn') return t.skip(`a random-weight model ended its reply with EOS within 3 tokens: ${JSON.stringify(textOf(m))}`);
    assert.equal(m.stop_reason, 'max_tokens', `max_tokens=3: stop_reason (text ${JSON.stringify(textOf(m))})`);
    assert.equal(m.usage.output_tokens, 3, 'max_tokens=3: output_tokens');
  });

  test('streaming with the SDK helper gives the non-streamed message (greedy)', async () => {
    const req = { model: ANTHROPIC_MODEL, max_tokens: 24, messages: MESSAGES, temperature: 0 };
    const full = await client.messages.create(req);
    assertMessage(full, 'non-streamed', 24);

    const stream = client.messages.stream(req);
    let pieces = '';
    stream.on('text', (delta) => {
      pieces += delta;
    });
    const final = await stream.finalMessage();
    assertMessage(final, 'stream finalMessage()', 24);
    assert.equal(pieces, textOf(full), 'the streamed text deltas must concatenate to the non-streamed text (temperature 0)');
    assert.equal(textOf(final), textOf(full), 'finalMessage() text must equal the non-streamed text');
    assert.equal(final.stop_reason, full.stop_reason, 'stream stop_reason');
    assert.equal(final.usage.output_tokens, full.usage.output_tokens, 'stream usage.output_tokens');
    assert.equal(promptTokens(final.usage), promptTokens(full.usage), 'stream prompt tokens (input_tokens + cache_read_input_tokens)');
  });

  test('raw stream: message_start, content_block_start, content_block_delta..., content_block_stop, message_delta, message_stop', async () => {
    const req = { model: ANTHROPIC_MODEL, max_tokens: 12, messages: MESSAGES, temperature: 0 };
    const full = await client.messages.create(req);
    const r = await srv.stream('/v1/messages', { ...req, stream: true }, { headers: HEADERS });
    assert.equal(r.status, 200, `stream: ${r.status} ${r.text}`);
    assert.match(r.headers.get('content-type') ?? '', /^text\/event-stream/, 'stream content-type');
    assert.equal(r.trailing.trim(), '', `nothing may follow message_stop, got ${JSON.stringify(r.trailing)}`);
    const s = checkEventSequence(r.events, 'raw Messages stream');
    assert.equal(s.text, textOf(full), 'raw stream text equals the non-streamed text (temperature 0)');
    assert.equal(s.delta.delta.stop_reason, full.stop_reason, 'message_delta stop_reason equals the non-streamed one');
    assert.equal(s.delta.usage.output_tokens, full.usage.output_tokens, 'message_delta usage.output_tokens equals the non-streamed one');
    assert.equal(promptTokens(s.start.usage), promptTokens(full.usage), 'message_start prompt tokens equal the non-streamed ones (input_tokens + cache_read_input_tokens)');
    if (s.delta.usage.input_tokens != null) assert.equal(promptTokens(s.delta.usage), promptTokens(full.usage), 'message_delta final usage: prompt tokens');
    assert.ok(!r.events.some((e) => e.data === '[DONE]'), 'the Messages stream has no OpenAI [DONE] terminator');
  });

  test('stop_sequences: the text is cut before the stop sequence; stop_reason "stop_sequence" names it', async (t) => {
    const req = { model: ANTHROPIC_MODEL, max_tokens: 24, messages: MESSAGES, temperature: 0 };
    const text = textOf(await client.messages.create(req));
    const pick = pickStopString(text);
    if (!pick && RANDOM_MODEL) return t.skip(`a random-weight model's greedy text has no stop sequence to pick: ${JSON.stringify(text)}`);
    if (!pick) assert.fail(`the model produced too little text to pick a stop sequence from: ${JSON.stringify(text)}`);
    t.diagnostic(`greedy text ${JSON.stringify(text)}; stop ${JSON.stringify(pick.stop)} at ${pick.index}`);
    const m = await client.messages.create({ ...req, stop_sequences: [pick.stop] });
    assertMessage(m, 'with stop_sequences', 24);
    assert.equal(textOf(m), text.slice(0, pick.index), 'text must be cut right before the stop sequence');
    assert.equal(m.stop_reason, 'stop_sequence', 'stop_reason');
    assert.equal(m.stop_sequence, pick.stop, 'stop_sequence names the matched sequence');

    const r = await srv.stream('/v1/messages', { ...req, stop_sequences: [pick.stop], stream: true }, { headers: HEADERS });
    assert.equal(r.status, 200, `stream with stop_sequences: ${r.status} ${r.text}`);
    const s = checkEventSequence(r.events, 'stream with stop_sequences');
    assert.equal(s.text, text.slice(0, pick.index), 'streamed text must be cut before the stop sequence (no partial match leaked)');
    assert.equal(s.delta.delta.stop_reason, 'stop_sequence', 'message_delta stop_reason');
    assert.equal(s.delta.delta.stop_sequence, pick.stop, 'message_delta stop_sequence');
  });

  test('system prompt: string and text-block forms are the same prompt, and are rendered', async () => {
    const system = 'You are a terse senior Python engineer. Answer with code only.';
    const req = { model: ANTHROPIC_MODEL, max_tokens: 8, messages: MESSAGES, temperature: 0 };
    const none = await client.messages.create(req);
    const str = await client.messages.create({ ...req, system });
    const blocks = await client.messages.create({ ...req, system: [{ type: 'text', text: system }] });
    assertMessage(str, 'system string', 8);
    assertMessage(blocks, 'system blocks', 8);
    assert.ok(promptTokens(str.usage) > promptTokens(none.usage), `the system prompt must be rendered: ${promptTokens(str.usage)} prompt tokens with it, ${promptTokens(none.usage)} without`);
    assert.equal(promptTokens(blocks.usage), promptTokens(str.usage), 'system as [{type:"text"}] must give the same prompt as the string');
    assert.equal(textOf(blocks), textOf(str), 'system as blocks or string: same greedy text');
  });

  test('count_tokens equals usage.input_tokens of the same request', async () => {
    const system = 'You write Python.';
    const messages = [
      { role: 'user', content: 'Write a function that reverses a string.' },
      { role: 'assistant', content: 'def reverse(s):\n    return s[::-1]' },
      { role: 'user', content: [{ type: 'text', text: 'Now add a docstring.' }] },
    ];
    const counted = await client.messages.countTokens({ model: ANTHROPIC_MODEL, messages, system });
    assertInt(counted.input_tokens, 'count_tokens input_tokens', { min: 1 });
    const m = await client.messages.create({ model: ANTHROPIC_MODEL, max_tokens: 1, messages, system, temperature: 0 });
    assert.equal(counted.input_tokens, promptTokens(m.usage), 'count_tokens must agree with the prompt tokens (input_tokens + cache_read_input_tokens) of the same messages');
    const fewer = await client.messages.countTokens({ model: ANTHROPIC_MODEL, messages: messages.slice(0, 1) });
    assert.ok(fewer.input_tokens < counted.input_tokens, `fewer messages, fewer tokens: ${fewer.input_tokens} vs ${counted.input_tokens}`);
  });
});

describe('tool use (plumbing)', () => {
  const tools = [
    { name: 'get_weather', description: 'Get the current weather for a city.', input_schema: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } },
  ];
  const ask = { role: 'user', content: 'What is the weather in Paris?' };
  const history = [
    ask,
    { role: 'assistant', content: [{ type: 'text', text: 'Let me check.' }, { type: 'tool_use', id: 'toolu_spill_1', name: 'get_weather', input: { city: 'Paris' } }] },
    { role: 'user', content: [{ type: 'tool_result', tool_use_id: 'toolu_spill_1', content: '18 C, clear sky' }] },
  ];

  function assertToolUse(m, what) {
    assertMessage(m, what, 16);
    const uses = m.content.filter((b) => b.type === 'tool_use');
    if (m.stop_reason === 'tool_use') assert.ok(uses.length > 0, `${what}: stop_reason tool_use needs a tool_use block`);
    for (const b of uses) {
      assert.equal(typeof b.id, 'string', `${what}: tool_use.id`);
      assert.equal(b.name, 'get_weather', `${what}: tool_use.name must be a declared tool`);
      assert.ok(b.input && typeof b.input === 'object' && !Array.isArray(b.input), `${what}: tool_use.input must be an object, got ${JSON.stringify(b.input)}`);
    }
  }

  test('tools and a tool_use / tool_result history are accepted and rendered', async (t) => {
    const plain = await client.messages.create({ model: ANTHROPIC_MODEL, max_tokens: 1, messages: [ask], temperature: 0 });
    const withTools = await client.messages.create({ model: ANTHROPIC_MODEL, max_tokens: 16, messages: [ask], tools, temperature: 0 });
    assertToolUse(withTools, 'tools');
    // Whether tool definitions reach the prompt depends on the model's chat template.
    t.diagnostic(`prompt tokens without tools ${promptTokens(plain.usage)}, with tools ${promptTokens(withTools.usage)}`);
    const after = await client.messages.create({ model: ANTHROPIC_MODEL, max_tokens: 16, messages: history, tools, temperature: 0 });
    assertToolUse(after, 'tool_use + tool_result history');
    assert.ok(promptTokens(after.usage) > promptTokens(withTools.usage), `the tool_use and tool_result turns must be rendered: ${promptTokens(after.usage)} vs ${promptTokens(withTools.usage)} prompt tokens`);
    const counted = await client.messages.countTokens({ model: ANTHROPIC_MODEL, messages: history, tools });
    assert.equal(counted.input_tokens, promptTokens(after.usage), 'count_tokens with tools agrees with the prompt tokens of the same request');
  });

  test('streaming with tools: a valid event sequence', async () => {
    const r = await srv.stream('/v1/messages', { model: ANTHROPIC_MODEL, max_tokens: 16, messages: history, tools, temperature: 0, stream: true }, { headers: HEADERS });
    assert.equal(r.status, 200, `stream with tools: ${r.status} ${r.text}`);
    checkEventSequence(r.events, 'stream with tools');
  });
});

describe('errors (Anthropic shape)', () => {
  test('malformed JSON, missing max_tokens, messages not an array, negative max_tokens: 400 invalid_request_error', async () => {
    const cases = [
      ['malformed JSON', '{"model": "claude-sonnet-4-5", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}'],
      ['missing max_tokens', { model: ANTHROPIC_MODEL, messages: MESSAGES }],
      ['messages not an array', { model: ANTHROPIC_MODEL, max_tokens: 8, messages: 'hi' }],
      ['max_tokens -5', { model: ANTHROPIC_MODEL, max_tokens: -5, messages: MESSAGES }],
      ['temperature "hot"', { model: ANTHROPIC_MODEL, max_tokens: 8, messages: MESSAGES, temperature: 'hot' }],
      ['role not user/assistant', { model: ANTHROPIC_MODEL, max_tokens: 8, messages: [{ role: 'wizard', content: 'hi' }] }],
    ];
    for (const [what, body] of cases) {
      const r = await srv.post('/v1/messages', body, { headers: HEADERS });
      assertAnthropicError(r, 400, 'invalid_request_error', `/v1/messages ${what}`);
    }
    const c = await srv.post('/v1/messages/count_tokens', '{"messages": [', { headers: HEADERS });
    assertAnthropicError(c, 400, 'invalid_request_error', '/v1/messages/count_tokens malformed JSON');
  });

  test('the SDK surfaces a 400 as BadRequestError', async () => {
    await assert.rejects(
      client.messages.create({ model: ANTHROPIC_MODEL, max_tokens: -5, messages: MESSAGES }),
      (e) => {
        assert.ok(e instanceof Anthropic.BadRequestError, `expected BadRequestError, got ${e?.constructor?.name}: ${e?.message}`);
        assert.equal(e.status, 400);
        assert.equal(e.error?.type, 'error', `SDK error body: ${JSON.stringify(e.error)}`);
        return true;
      },
    );
  });
});
