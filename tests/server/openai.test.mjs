// OpenAI-compatible API through the official `openai` SDK and raw HTTP: chat completions and
// completions, non-streaming and streaming, usage, finish reasons, stop sequences, n, unknown
// fields, tool-call plumbing.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';

import { assertInt, assertNamesField, assertOpenAIError, assertOpenAIUsage, openaiStreamText, pickStopString, RANDOM_MODEL, startServer } from './helpers.mjs';

const CHAT = [{ role: 'user', content: 'Write a Python function that returns the n-th Fibonacci number.' }];
const PROMPT = 'import os\n\n\ndef list_python_files(root):\n    """Return the paths of all .py files under root."""\n';
const FINISH = ['stop', 'length'];

let srv;
let client;
let model;

before(async () => {
  srv = await startServer();
  client = srv.openai();
  model = await srv.modelId();
});
after(() => srv?.stop());

function assertChatCompletion(r, what, maxTokens) {
  assert.equal(r.object, 'chat.completion', `${what}: object`);
  assert.equal(typeof r.id, 'string', `${what}: id must be a string`);
  assert.ok(r.id.length > 0, `${what}: id must not be empty`);
  assertInt(r.created, `${what}: created (unix seconds)`, { min: 1_600_000_000 });
  assert.equal(typeof r.model, 'string', `${what}: model must be a string`);
  assert.ok(Array.isArray(r.choices) && r.choices.length === 1, `${what}: exactly one choice expected, got ${JSON.stringify(r.choices)}`);
  const c = r.choices[0];
  assert.equal(c.index, 0, `${what}: choices[0].index`);
  assert.equal(c.message?.role, 'assistant', `${what}: choices[0].message.role`);
  assert.equal(typeof c.message.content, 'string', `${what}: choices[0].message.content must be a string`);
  assert.ok(FINISH.includes(c.finish_reason), `${what}: finish_reason must be stop or length, got ${c.finish_reason}`);
  assertOpenAIUsage(r.usage, what, { maxCompletion: maxTokens });
  if (c.finish_reason === 'length') assert.equal(r.usage.completion_tokens, maxTokens, `${what}: finish_reason "length" means completion_tokens == max_tokens`);
  return c;
}

function assertTextCompletion(r, what, maxTokens) {
  assert.equal(r.object, 'text_completion', `${what}: object`);
  assert.equal(typeof r.id, 'string', `${what}: id must be a string`);
  assertInt(r.created, `${what}: created (unix seconds)`, { min: 1_600_000_000 });
  assert.ok(Array.isArray(r.choices) && r.choices.length === 1, `${what}: exactly one choice expected, got ${JSON.stringify(r.choices)}`);
  const c = r.choices[0];
  assert.equal(c.index, 0, `${what}: choices[0].index`);
  assert.equal(typeof c.text, 'string', `${what}: choices[0].text must be a string`);
  assert.ok(FINISH.includes(c.finish_reason), `${what}: finish_reason must be stop or length, got ${c.finish_reason}`);
  assertOpenAIUsage(r.usage, what, { maxCompletion: maxTokens });
  if (c.finish_reason === 'length') assert.equal(r.usage.completion_tokens, maxTokens, `${what}: finish_reason "length" means completion_tokens == max_tokens`);
  return c;
}

// Collects an SDK stream; checks the chunk shapes; returns {text, chunks, finish, usageChunk}.
async function collectChatStream(stream, what) {
  const chunks = [];
  for await (const chunk of stream) chunks.push(chunk);
  assert.ok(chunks.length > 0, `${what}: the stream produced no chunks`);
  const ids = new Set(chunks.map((c) => c.id));
  assert.equal(ids.size, 1, `${what}: every chunk must carry the same id, got ${[...ids].join(', ')}`);
  for (const c of chunks) assert.equal(c.object, 'chat.completion.chunk', `${what}: chunk object`);
  const firstDelta = chunks.find((c) => c.choices?.length)?.choices[0].delta;
  assert.equal(firstDelta?.role, 'assistant', `${what}: the first chunk's delta must carry role "assistant", got ${JSON.stringify(firstDelta)}`);
  const finishes = chunks.flatMap((c) => (c.choices ?? []).filter((ch) => ch.finish_reason != null).map((ch) => ch.finish_reason));
  assert.equal(finishes.length, 1, `${what}: exactly one chunk must carry a finish_reason, got ${JSON.stringify(finishes)}`);
  return { text: openaiStreamText(chunks), chunks, finish: finishes[0] };
}

describe('chat completions', () => {
  test('non-streaming: response shape, usage with prompt_tokens_details.cached_tokens', async () => {
    const r = await client.chat.completions.create({ model, messages: CHAT, max_tokens: 16, temperature: 0 });
    assertChatCompletion(r, 'chat completion', 16);
  });

  test('finish_reason "length" when max_tokens / max_completion_tokens is hit', async () => {
    const r = await client.chat.completions.create({ model, messages: CHAT, max_tokens: 3, temperature: 0 });
    const c = assertChatCompletion(r, 'max_tokens=3', 3);
    assert.equal(c.finish_reason, 'length', `max_tokens=3: expected finish_reason "length" (text ${JSON.stringify(c.message.content)})`);
    assert.equal(r.usage.completion_tokens, 3, 'max_tokens=3: completion_tokens');

    const r2 = await client.chat.completions.create({ model, messages: CHAT, max_completion_tokens: 3, temperature: 0 });
    const c2 = assertChatCompletion(r2, 'max_completion_tokens=3', 3);
    assert.equal(c2.finish_reason, 'length', 'max_completion_tokens=3: expected finish_reason "length"');
    assert.equal(c2.message.content, c.message.content, 'max_completion_tokens and max_tokens must behave the same (greedy)');
  });

  test('streaming reassembles to the non-streamed text (greedy); include_usage adds a final usage chunk with empty choices', async () => {
    const req = { model, messages: CHAT, max_tokens: 24, temperature: 0 };
    const full = await client.chat.completions.create(req);
    const c = assertChatCompletion(full, 'non-streamed', 24);

    const s = await collectChatStream(await client.chat.completions.create({ ...req, stream: true, stream_options: { include_usage: true } }), 'stream with include_usage');
    assert.equal(s.text, c.message.content, 'streamed deltas must concatenate to the non-streamed content (temperature 0)');
    assert.equal(s.finish, c.finish_reason, 'streamed finish_reason must equal the non-streamed one');
    const last = s.chunks.at(-1);
    assert.deepEqual(last.choices, [], `include_usage: the last chunk must have choices: [], got ${JSON.stringify(last.choices)}`);
    assertOpenAIUsage(last.usage, 'include_usage final chunk', { maxCompletion: 24 });
    assert.equal(last.usage.prompt_tokens, full.usage.prompt_tokens, 'streamed usage.prompt_tokens must equal the non-streamed one');
    assert.equal(last.usage.completion_tokens, full.usage.completion_tokens, 'streamed usage.completion_tokens must equal the non-streamed one');
    for (const ch of s.chunks.slice(0, -1)) assert.ok(ch.usage == null, `include_usage: only the last chunk carries usage, got ${JSON.stringify(ch)}`);

    const plain = await collectChatStream(await client.chat.completions.create({ ...req, stream: true }), 'stream without include_usage');
    assert.equal(plain.text, c.message.content, 'stream without stream_options must give the same text');
  });

  test('raw SSE: text/event-stream, JSON data lines, terminated by data: [DONE]', async () => {
    const r = await srv.stream('/v1/chat/completions', { model, messages: CHAT, max_tokens: 8, temperature: 0, stream: true, stream_options: { include_usage: true } });
    assert.equal(r.status, 200, `stream: expected 200, got ${r.status}: ${r.text}`);
    assert.match(r.headers.get('content-type') ?? '', /^text\/event-stream/, 'stream content-type');
    assert.ok(r.events.length >= 3, `expected role, content/finish, usage chunks and [DONE]; got ${r.events.length} events`);
    assert.equal(r.events.at(-1).data, '[DONE]', `the last event must be "data: [DONE]", got ${JSON.stringify(r.events.at(-1).data)}`);
    for (const ev of r.events.slice(0, -1)) {
      assert.ok(ev.json && typeof ev.json === 'object', `every event before [DONE] must be a JSON chunk, got ${JSON.stringify(ev.data)}`);
      assert.equal(ev.json.error, undefined, `no error event may appear in a successful stream: ${ev.data}`);
    }
    assert.equal(r.trailing.trim(), '', `nothing may follow data: [DONE], got ${JSON.stringify(r.trailing)}`);
    assert.equal(r.events.filter((e) => e.data === '[DONE]').length, 1, 'exactly one [DONE]');
  });

  test('content given as an array of text parts, and a system message, are accepted', async () => {
    const r = await client.chat.completions.create({
      model,
      messages: [
        { role: 'system', content: 'You write short Python.' },
        { role: 'user', content: [{ type: 'text', text: 'Write a function that adds ' }, { type: 'text', text: 'two numbers.' }] },
      ],
      max_tokens: 8,
      temperature: 0,
    });
    assertChatCompletion(r, 'array content', 8);
    const noSystem = await client.chat.completions.create({ model, messages: [{ role: 'user', content: 'Write a function that adds two numbers.' }], max_tokens: 1, temperature: 0 });
    assert.ok(r.usage.prompt_tokens > noSystem.usage.prompt_tokens, `the system message must be rendered into the prompt: ${r.usage.prompt_tokens} prompt tokens with it, ${noSystem.usage.prompt_tokens} without`);
  });
});

describe('completions', () => {
  test('non-streaming: response shape and usage; finish_reason "length" when max_tokens is hit', async (t) => {
    const r = await client.completions.create({ model, prompt: PROMPT, max_tokens: 16, temperature: 0 });
    assertTextCompletion(r, 'completion', 16);
    const short = await client.completions.create({ model, prompt: PROMPT, max_tokens: 4, temperature: 0 });
    const c = assertTextCompletion(short, 'completion max_tokens=4', 4);
    if (RANDOM_MODEL && c.finish_reason === 'stop') return t.skip(`a random-weight model ended with EOS within 4 tokens: ${JSON.stringify(c.text)}`);
    assert.equal(c.finish_reason, 'length', `max_tokens=4: expected finish_reason "length" (text ${JSON.stringify(c.text)})`);
    assert.equal(short.usage.completion_tokens, 4, 'max_tokens=4: completion_tokens');
    assert.ok(r.choices[0].text.startsWith(c.text), `greedy: the 4-token completion ${JSON.stringify(c.text)} must be a prefix of the 16-token one ${JSON.stringify(r.choices[0].text)}`);
  });

  test('streaming reassembles to the non-streamed text (greedy); include_usage; [DONE]', async () => {
    const req = { model, prompt: PROMPT, max_tokens: 24, temperature: 0 };
    const full = await client.completions.create(req);
    const c = assertTextCompletion(full, 'non-streamed', 24);

    const chunks = [];
    for await (const chunk of await client.completions.create({ ...req, stream: true, stream_options: { include_usage: true } })) chunks.push(chunk);
    for (const ch of chunks) assert.equal(ch.object, 'text_completion', 'completion chunk object');
    assert.equal(openaiStreamText(chunks), c.text, 'streamed text pieces must concatenate to the non-streamed text (temperature 0)');
    const finishes = chunks.flatMap((ch) => (ch.choices ?? []).filter((x) => x.finish_reason != null).map((x) => x.finish_reason));
    assert.deepEqual(finishes, [c.finish_reason], 'exactly one chunk carries the finish_reason, equal to the non-streamed one');
    assert.deepEqual(chunks.at(-1).choices, [], 'include_usage: the last chunk has choices: []');
    assertOpenAIUsage(chunks.at(-1).usage, 'include_usage final chunk', { maxCompletion: 24 });
    assert.equal(chunks.at(-1).usage.completion_tokens, full.usage.completion_tokens, 'streamed completion_tokens');

    const raw = await srv.stream('/v1/completions', { ...req, stream: true });
    assert.equal(raw.status, 200, `raw stream: ${raw.status} ${raw.text}`);
    assert.match(raw.headers.get('content-type') ?? '', /^text\/event-stream/, 'stream content-type');
    assert.equal(raw.events.at(-1)?.data, '[DONE]', 'the completions stream must end with data: [DONE]');
    assert.equal(openaiStreamText(raw.events.slice(0, -1).map((e) => e.json)), c.text, 'raw stream text');
  });

  test('a prompt given as an array of one string, or as token ids, is accepted', async () => {
    const a = await client.completions.create({ model, prompt: [PROMPT], max_tokens: 4, temperature: 0 });
    const b = await client.completions.create({ model, prompt: PROMPT, max_tokens: 4, temperature: 0 });
    assert.equal(a.choices[0].text, b.choices[0].text, 'prompt ["x"] must behave like prompt "x"');
    // The ids /tokenize returns with its default (special tokens added, as for a text prompt).
    const tok = await srv.post('/tokenize', { model, prompt: PROMPT });
    if (tok.status === 200 && Array.isArray(tok.json?.tokens)) {
      const c = await srv.post('/v1/completions', { model, prompt: tok.json.tokens, max_tokens: 4, temperature: 0 });
      assert.equal(c.status, 200, `prompt as token ids: ${c.status} ${c.text.slice(0, 300)}`);
      assert.equal(c.json.choices[0].text, b.choices[0].text, 'prompt as token ids must complete like the same text');
    }
  });
});

describe('stop sequences', () => {
  test('completions: the text is cut before the stop string, which does not appear (stream and non-stream)', async (t) => {
    const base = await client.completions.create({ model, prompt: PROMPT, max_tokens: 24, temperature: 0 });
    const text = base.choices[0].text;
    const pick = pickStopString(text);
    if (!pick && RANDOM_MODEL) return t.skip(`a random-weight model's greedy text has no stop string to pick: ${JSON.stringify(text)}`);
    if (!pick) assert.fail(`the model produced too little text to pick a stop string from: ${JSON.stringify(text)}`);
    t.diagnostic(`greedy text ${JSON.stringify(text)}; stop ${JSON.stringify(pick.stop)} at ${pick.index}`);
    const expected = text.slice(0, pick.index);
    for (const stop of [[pick.stop], pick.stop, [pick.stop, '\u0000never-generated\u0000']]) {
      const r = await client.completions.create({ model, prompt: PROMPT, max_tokens: 24, temperature: 0, stop });
      assert.equal(r.choices[0].text, expected, `stop=${JSON.stringify(stop)}: text must be cut right before the stop string`);
      assert.equal(r.choices[0].finish_reason, 'stop', `stop=${JSON.stringify(stop)}: finish_reason`);
    }
    const chunks = [];
    for await (const ch of await client.completions.create({ model, prompt: PROMPT, max_tokens: 24, temperature: 0, stop: [pick.stop], stream: true })) chunks.push(ch);
    const streamed = openaiStreamText(chunks);
    assert.equal(streamed, expected, 'streaming with stop: the reassembled text must be cut before the stop string (no partial stop string leaked)');
  });

  test('chat: the content is cut before the stop string, which does not appear (stream and non-stream)', async (t) => {
    const base = await client.chat.completions.create({ model, messages: CHAT, max_tokens: 24, temperature: 0 });
    const text = base.choices[0].message.content;
    const pick = pickStopString(text);
    if (!pick && RANDOM_MODEL) return t.skip(`a random-weight model's greedy text has no stop string to pick: ${JSON.stringify(text)}`);
    if (!pick) assert.fail(`the model produced too little text to pick a stop string from: ${JSON.stringify(text)}`);
    t.diagnostic(`greedy text ${JSON.stringify(text)}; stop ${JSON.stringify(pick.stop)} at ${pick.index}`);
    const expected = text.slice(0, pick.index);
    const r = await client.chat.completions.create({ model, messages: CHAT, max_tokens: 24, temperature: 0, stop: [pick.stop] });
    assert.equal(r.choices[0].message.content, expected, 'chat with stop: content must be cut right before the stop string');
    assert.ok(!r.choices[0].message.content.includes(pick.stop), 'the stop string must not appear');
    assert.equal(r.choices[0].finish_reason, 'stop', 'chat with stop: finish_reason');
    const s = await collectChatStream(await client.chat.completions.create({ model, messages: CHAT, max_tokens: 24, temperature: 0, stop: [pick.stop], stream: true }), 'chat stream with stop');
    assert.equal(s.text, expected, 'chat streaming with stop: reassembled content');
    assert.equal(s.finish, 'stop', 'chat streaming with stop: finish_reason');
  });
});

describe('request options', () => {
  test('n=2: either two choices or a 400 that names "n"', async (t) => {
    const r = await srv.post('/v1/chat/completions', { model, messages: CHAT, max_tokens: 8, temperature: 0, n: 2 });
    if (r.status === 200) {
      const choices = r.json.choices;
      assert.equal(choices?.length, 2, `n=2 accepted: expected 2 choices, got ${r.text.slice(0, 400)}`);
      assert.deepEqual(choices.map((c) => c.index).sort(), [0, 1], 'n=2: choice indices 0 and 1');
      for (const c of choices) assert.equal(typeof c.message?.content, 'string', 'n=2: each choice has message.content');
      assert.equal(choices[0].message.content, choices[1].message.content, 'n=2 at temperature 0: both choices are the greedy text');
      t.diagnostic('n=2 is supported');
    } else {
      const e = assertOpenAIError(r, 400, 'n=2 rejected');
      assertNamesField(e, 'n', 'n=2 rejected');
      t.diagnostic(`n=2 is rejected: ${e.message}`);
    }
  });

  test('unknown and optional fields are ignored (200)', async () => {
    const r = await srv.post('/v1/chat/completions', {
      model,
      messages: CHAT,
      max_tokens: 4,
      temperature: 0,
      spill_unknown_field: { nested: [1, 2, 3] },
      another_unknown: 'x',
      user: 'test-user',
      seed: 1234,
      presence_penalty: 0,
      frequency_penalty: 0,
      top_p: 1,
      metadata: { run: 'server-tests' },
      store: false,
      parallel_tool_calls: true,
    });
    assert.equal(r.status, 200, `unknown fields must be ignored: got ${r.status}: ${r.text.slice(0, 400)}`);
    assertChatCompletion(r.json, 'with unknown fields', 4);
    const c = await srv.post('/v1/completions', { model, prompt: PROMPT, max_tokens: 4, temperature: 0, spill_unknown_field: true, echo: false, best_of: 1, suffix: null });
    assert.equal(c.status, 200, `completions with unknown fields: got ${c.status}: ${c.text.slice(0, 400)}`);
  });
});

// The tiny model is not trained to call tools, so what is checked is the plumbing: tools and tool
// results are accepted and rendered into the prompt, and any tool call that comes back is well formed.
describe('tool calls (plumbing)', () => {
  const tools = [
    {
      type: 'function',
      function: {
        name: 'get_weather',
        description: 'Get the current weather for a city.',
        parameters: { type: 'object', properties: { city: { type: 'string', description: 'City name' } }, required: ['city'] },
      },
    },
  ];
  const ask = { role: 'user', content: 'What is the weather in Paris?' };
  const history = [
    ask,
    { role: 'assistant', content: null, tool_calls: [{ id: 'call_spill_1', type: 'function', function: { name: 'get_weather', arguments: '{"city": "Paris"}' } }] },
    { role: 'tool', tool_call_id: 'call_spill_1', content: '{"temperature_c": 18, "sky": "clear"}' },
  ];

  function assertToolPlumbing(r, what) {
    const c = r.choices[0];
    assert.ok(['stop', 'length', 'tool_calls'].includes(c.finish_reason), `${what}: finish_reason must be stop, length or tool_calls, got ${c.finish_reason}`);
    const calls = c.message.tool_calls ?? [];
    if (c.finish_reason === 'tool_calls') assert.ok(calls.length > 0, `${what}: finish_reason tool_calls needs message.tool_calls`);
    for (const call of calls) {
      assert.equal(typeof call.id, 'string', `${what}: tool_call.id`);
      assert.equal(call.type, 'function', `${what}: tool_call.type`);
      assert.equal(call.function?.name, 'get_weather', `${what}: tool_call.function.name must be a declared tool`);
      assert.equal(typeof call.function.arguments, 'string', `${what}: tool_call.function.arguments must be a JSON string`);
      if (c.finish_reason === 'tool_calls') assert.doesNotThrow(() => JSON.parse(call.function.arguments), `${what}: arguments must parse as JSON: ${call.function.arguments}`);
    }
  }

  test('tools are accepted; tool calls and tool results in the history are accepted and rendered', async (t) => {
    const plain = await client.chat.completions.create({ model, messages: [ask], max_tokens: 1, temperature: 0 });
    const withTools = await client.chat.completions.create({ model, messages: [ask], tools, tool_choice: 'auto', max_tokens: 16, temperature: 0 });
    assertToolPlumbing(withTools, 'tools, tool_choice auto');
    // Whether tool definitions reach the prompt depends on the model's chat template.
    t.diagnostic(`prompt tokens without tools ${plain.usage.prompt_tokens}, with tools ${withTools.usage.prompt_tokens}`);

    const after = await client.chat.completions.create({ model, messages: history, tools, max_tokens: 16, temperature: 0 });
    assertToolPlumbing(after, 'assistant tool_calls + tool result in the history');
    assert.ok(after.usage.prompt_tokens > withTools.usage.prompt_tokens, `the assistant tool call and the tool result must be rendered into the prompt: ${after.usage.prompt_tokens} vs ${withTools.usage.prompt_tokens} prompt tokens`);
  });

  test('streaming with tools: well-formed chunks, finish_reason stop/length/tool_calls, [DONE]', async () => {
    const r = await srv.stream('/v1/chat/completions', { model, messages: history, tools, max_tokens: 16, temperature: 0, stream: true });
    assert.equal(r.status, 200, `stream with tools: ${r.status} ${r.text}`);
    assert.equal(r.events.at(-1)?.data, '[DONE]', 'stream with tools ends with [DONE]');
    const chunks = r.events.slice(0, -1).map((e) => e.json);
    const finishes = chunks.flatMap((c) => (c.choices ?? []).filter((x) => x.finish_reason != null).map((x) => x.finish_reason));
    assert.equal(finishes.length, 1, `exactly one finish_reason, got ${JSON.stringify(finishes)}`);
    assert.ok(['stop', 'length', 'tool_calls'].includes(finishes[0]), `finish_reason ${finishes[0]}`);
    for (const c of chunks) {
      for (const tc of c.choices?.[0]?.delta?.tool_calls ?? []) assertInt(tc.index, 'delta.tool_calls[].index', { min: 0 });
    }
  });

  test('tool_choice "none" never returns tool calls', async () => {
    const r = await client.chat.completions.create({ model, messages: [ask], tools, tool_choice: 'none', max_tokens: 16, temperature: 0 });
    assert.ok(['stop', 'length'].includes(r.choices[0].finish_reason), `tool_choice none: finish_reason ${r.choices[0].finish_reason}`);
    assert.ok(!r.choices[0].message.tool_calls?.length, `tool_choice none: no tool_calls expected, got ${JSON.stringify(r.choices[0].message.tool_calls)}`);
  });
});
