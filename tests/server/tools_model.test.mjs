// Real tool calls, end to end: the bundled spill-tiny was trained on Qwen/Hermes-style tool-use
// conversations (its model card: 50/50 exact calls on held-out prompts), so given tools and a
// matching request it writes `<tool_call>{"name", "arguments"}</tool_call>`, which spill must return
// as OpenAI tool_calls / Anthropic tool_use blocks, streamed as deltas, with the matching finish
// reason. Greedy decoding makes the replies deterministic.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';

import { ANTHROPIC_MODEL, startServer, unlessTrained } from './helpers.mjs';

const SKIP = unlessTrained('these are the calls spill-tiny was trained to write');

const WEATHER = {
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'Get the current weather for a city.',
    parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
  },
};
const READ_FILE = {
  type: 'function',
  function: {
    name: 'read_file',
    description: 'Read a file.',
    parameters: { type: 'object', properties: { path: { type: 'string' } }, required: ['path'] },
  },
};
const toAnthropic = (t) => ({ name: t.function.name, description: t.function.description, input_schema: t.function.parameters });
const ASK_WEATHER = [{ role: 'user', content: 'What is the weather in Paris?' }];
const ASK_FILE = [{ role: 'user', content: 'Read the file src/main.py' }];

let srv;
let model;

before(async () => {
  if (SKIP) return;
  srv = await startServer();
  model = await srv.modelId();
});
after(async () => {
  await srv?.stop();
});

describe('the model calls tools (OpenAI)', { skip: SKIP }, () => {
  test('non-streaming: tool_calls with parsed JSON arguments, finish_reason tool_calls', async () => {
    const r = await srv.openai().chat.completions.create({ model, messages: ASK_WEATHER, tools: [WEATHER, READ_FILE], max_tokens: 64, temperature: 0 });
    const c = r.choices[0];
    assert.equal(c.finish_reason, 'tool_calls', `finish_reason: ${JSON.stringify(c)}`);
    assert.equal(c.message.tool_calls?.length, 1, `one call: ${JSON.stringify(c.message)}`);
    const call = c.message.tool_calls[0];
    assert.equal(call.type, 'function');
    assert.match(call.id, /^call_/, 'call id');
    assert.equal(call.function.name, 'get_weather');
    assert.deepEqual(JSON.parse(call.function.arguments), { city: 'Paris' });
    assert.ok(!c.message.content, `no text besides the call: ${JSON.stringify(c.message.content)}`);
  });

  test('streaming: tool call deltas assemble to the non-streamed call', async () => {
    const body = { model, messages: ASK_FILE, tools: [WEATHER, READ_FILE], max_tokens: 64, temperature: 0 };
    const full = await srv.openai().chat.completions.create(body);
    const stream = await srv.openai().chat.completions.create({ ...body, stream: true });
    const calls = [];
    let finish = null;
    let content = '';
    for await (const chunk of stream) {
      const choice = chunk.choices[0];
      if (!choice) continue;
      content += choice.delta?.content ?? '';
      for (const tc of choice.delta?.tool_calls ?? []) {
        calls[tc.index] ??= { id: '', name: '', arguments: '' };
        calls[tc.index].id += tc.id ?? '';
        calls[tc.index].name += tc.function?.name ?? '';
        calls[tc.index].arguments += tc.function?.arguments ?? '';
      }
      finish = choice.finish_reason ?? finish;
    }
    assert.equal(finish, 'tool_calls');
    assert.equal(content, '', 'no text deltas besides the call');
    assert.equal(calls.length, 1, JSON.stringify(calls));
    assert.equal(calls[0].name, 'read_file');
    assert.deepEqual(JSON.parse(calls[0].arguments), { path: 'src/main.py' });
    const want = full.choices[0].message.tool_calls[0];
    assert.equal(calls[0].name, want.function.name, 'same call streamed and not');
    assert.deepEqual(JSON.parse(calls[0].arguments), JSON.parse(want.function.arguments));
  });

  test('the call and its result go back into the conversation, and the model answers', async () => {
    const first = await srv.openai().chat.completions.create({ model, messages: ASK_WEATHER, tools: [WEATHER], max_tokens: 64, temperature: 0 });
    const call = first.choices[0].message.tool_calls[0];
    const messages = [
      ...ASK_WEATHER,
      first.choices[0].message,
      { role: 'tool', tool_call_id: call.id, content: '{"temperature": 18, "unit": "celsius", "conditions": "clear"}' },
    ];
    const second = await srv.openai().chat.completions.create({ model, messages, tools: [WEATHER], max_tokens: 48, temperature: 0 });
    assert.ok(['stop', 'length', 'tool_calls'].includes(second.choices[0].finish_reason));
    assert.ok(second.usage.prompt_tokens > first.usage.prompt_tokens, 'the call and the result are in the prompt');
    assert.ok(second.usage.prompt_tokens_details.cached_tokens > 0, 'the shared conversation prefix comes from the prefix cache');
  });
});

describe('the model calls tools (Anthropic)', { skip: SKIP }, () => {
  test('non-streaming: a tool_use block with the input object, stop_reason tool_use', async () => {
    const m = await srv.anthropic().messages.create({ model: ANTHROPIC_MODEL, max_tokens: 64, messages: ASK_FILE, tools: [WEATHER, READ_FILE].map(toAnthropic), temperature: 0 });
    assert.equal(m.stop_reason, 'tool_use', JSON.stringify(m));
    const uses = m.content.filter((b) => b.type === 'tool_use');
    assert.equal(uses.length, 1, JSON.stringify(m.content));
    assert.equal(uses[0].name, 'read_file');
    assert.deepEqual(uses[0].input, { path: 'src/main.py' });
    assert.match(uses[0].id, /^toolu_/);
  });

  test('streaming: the SDK assembles the same tool_use from input_json_delta events', async () => {
    const stream = srv.anthropic().messages.stream({ model: ANTHROPIC_MODEL, max_tokens: 64, messages: ASK_WEATHER, tools: [toAnthropic(WEATHER)], temperature: 0 });
    const types = [];
    stream.on('streamEvent', (e) => types.push(e.type === 'content_block_delta' ? `${e.type}:${e.delta.type}` : e.type));
    const m = await stream.finalMessage();
    assert.equal(m.stop_reason, 'tool_use');
    const use = m.content.find((b) => b.type === 'tool_use');
    assert.ok(use, JSON.stringify(m.content));
    assert.equal(use.name, 'get_weather');
    assert.deepEqual(use.input, { city: 'Paris' });
    assert.ok(types.includes('content_block_delta:input_json_delta'), `input_json_delta events: ${types.join(',')}`);
    assert.equal(types[0], 'message_start');
    assert.equal(types.at(-1), 'message_stop');
  });

  test('tool_result goes back and the model continues', async () => {
    const first = await srv.anthropic().messages.create({ model: ANTHROPIC_MODEL, max_tokens: 64, messages: ASK_WEATHER, tools: [toAnthropic(WEATHER)], temperature: 0 });
    const use = first.content.find((b) => b.type === 'tool_use');
    const second = await srv.anthropic().messages.create({
      model: ANTHROPIC_MODEL,
      max_tokens: 48,
      tools: [toAnthropic(WEATHER)],
      temperature: 0,
      messages: [
        ...ASK_WEATHER,
        { role: 'assistant', content: first.content },
        { role: 'user', content: [{ type: 'tool_result', tool_use_id: use.id, content: '18 C, clear' }] },
      ],
    });
    assert.ok(['end_turn', 'max_tokens', 'tool_use'].includes(second.stop_reason), second.stop_reason);
    assert.ok(second.usage.input_tokens + (second.usage.cache_read_input_tokens ?? 0) > first.usage.input_tokens, 'the call and its result are in the prompt');
  });
});
