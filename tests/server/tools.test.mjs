// Tool calls with the template spill uses when a model has none: ChatML with a Hermes-style tools
// section (docs/API.md). The server runs a copy of the test model with its chat template removed.
//
// tools_model.test.mjs tests the model's own tool calls through its own template; this file checks
// the fallback template's plumbing: tool definitions reach the prompt,
// and a forced tool_choice starts the reply with `<tool_call>{"name": "N", "arguments": `, which
// comes back either parsed (a tool call of that name) or, when the model's continuation is not
// valid JSON, as text with the tags included.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';

import { ANTHROPIC_MODEL, assertInt, modelWithoutChatTemplate, startServer, templateRendersTools } from './helpers.mjs';

const TOOLS = [
  {
    type: 'function',
    function: {
      name: 'get_weather',
      description: 'Get the current weather for a city.',
      parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
    },
  },
  {
    type: 'function',
    function: { name: 'list_files', description: 'List the files in a directory.', parameters: { type: 'object', properties: { path: { type: 'string' } }, required: ['path'] } },
  },
];
const ANTHROPIC_TOOLS = TOOLS.map((x) => ({ name: x.function.name, description: x.function.description, input_schema: x.function.parameters }));
const ASK = [{ role: 'user', content: 'What is the weather in Paris?' }];
const FORCED = /^\s*<tool_call>\s*\{\s*"name":\s*"get_weather"/;
const REQUIRED = /^\s*<tool_call>/;

let srv;
let model;
let copy;

before(async () => {
  copy = modelWithoutChatTemplate();
  srv = await startServer({ model: copy.dir });
  model = await srv.modelId();
});
after(async () => {
  await srv?.stop();
  copy?.remove();
});

// A parsed call to `name`, or the forced call returned as text (`pattern`); returns which.
function assertForcedOpenAI(r, name, pattern, what) {
  const c = r.choices[0];
  const calls = c.message.tool_calls ?? [];
  if (calls.length) {
    assert.equal(calls[0].type, 'function', `${what}: tool_calls[0].type`);
    if (name) assert.equal(calls[0].function.name, name, `${what}: the forced function is called`);
    assert.equal(typeof calls[0].id, 'string', `${what}: tool_calls[0].id`);
    assert.doesNotThrow(() => JSON.parse(calls[0].function.arguments), `${what}: arguments must be a JSON string: ${calls[0].function.arguments}`);
    assert.equal(c.finish_reason, 'tool_calls', `${what}: a parsed call ends with finish_reason tool_calls`);
    return 'parsed';
  }
  assert.match(c.message.content ?? '', pattern, `${what}: no call was parsed, so the forced call must come back as text: ${JSON.stringify(c.message.content)}`);
  assert.notEqual(c.finish_reason, 'tool_calls', `${what}: finish_reason tool_calls without tool_calls`);
  return 'text';
}

describe('tool definitions reach the prompt', () => {
  test('the fallback template renders tools (more prompt tokens with tools, /tokenize agrees)', async () => {
    assert.ok(await templateRendersTools(srv, ASK, TOOLS), '/tokenize with tools must give more tokens than without (ChatML + Hermes tools section)');
    const plain = await srv.post('/v1/chat/completions', { model, messages: ASK, max_tokens: 1, temperature: 0 });
    const withTools = await srv.post('/v1/chat/completions', { model, messages: ASK, tools: TOOLS, max_tokens: 1, temperature: 0 });
    assert.equal(plain.status, 200, plain.text);
    assert.equal(withTools.status, 200, withTools.text);
    assert.ok(withTools.json.usage.prompt_tokens > plain.json.usage.prompt_tokens + 20, `tool definitions must be in the prompt: ${withTools.json.usage.prompt_tokens} vs ${plain.json.usage.prompt_tokens} prompt tokens`);
    const counted = await srv.post('/v1/messages/count_tokens', { model: ANTHROPIC_MODEL, messages: ASK, tools: ANTHROPIC_TOOLS });
    assert.equal(counted.status, 200, counted.text);
    assert.equal(counted.json.input_tokens, withTools.json.usage.prompt_tokens, 'Anthropic tools and the same OpenAI tools render the same prompt');
  });
});

describe('forced tool_choice (OpenAI)', () => {
  test('named function: the reply is that call (parsed, or as <tool_call> text)', async (t) => {
    const r = await srv.openai().chat.completions.create({ model, messages: ASK, tools: TOOLS, tool_choice: { type: 'function', function: { name: 'get_weather' } }, max_tokens: 24, temperature: 0 });
    t.diagnostic(`forced call came back ${assertForcedOpenAI(r, 'get_weather', FORCED, 'named tool_choice')}: ${JSON.stringify(r.choices[0].message)}`);
  });

  test('"required": the reply starts a tool call', async () => {
    const r = await srv.openai().chat.completions.create({ model, messages: ASK, tools: TOOLS, tool_choice: 'required', max_tokens: 24, temperature: 0 });
    assertForcedOpenAI(r, null, REQUIRED, 'tool_choice required');
  });

  test('"none": nothing is parsed as a call, and the reply is not forced', async () => {
    const r = await srv.openai().chat.completions.create({ model, messages: ASK, tools: TOOLS, tool_choice: 'none', max_tokens: 16, temperature: 0 });
    assert.ok(!r.choices[0].message.tool_calls?.length, `tool_choice none: no tool_calls, got ${JSON.stringify(r.choices[0].message.tool_calls)}`);
    assert.ok(['stop', 'length'].includes(r.choices[0].finish_reason), `tool_choice none: finish_reason ${r.choices[0].finish_reason}`);
    // spill-tiny was trained on tool calls and may still write one on its own; with tool_choice
    // none it must come back as text, never as a parsed call.
  });

  test('streaming a forced call gives the same reply as non-streaming (greedy)', async () => {
    const body = { model, messages: ASK, tools: TOOLS, tool_choice: { type: 'function', function: { name: 'get_weather' } }, max_tokens: 24, temperature: 0 };
    const full = await srv.post('/v1/chat/completions', body);
    assert.equal(full.status, 200, full.text);
    const s = await srv.stream('/v1/chat/completions', { ...body, stream: true });
    assert.equal(s.status, 200, s.text);
    assert.equal(s.events.at(-1)?.data, '[DONE]', 'stream ends with [DONE]');
    const chunks = s.events.slice(0, -1).map((e) => e.json);
    let content = '';
    const calls = [];
    for (const c of chunks) {
      const d = c.choices?.[0]?.delta ?? {};
      content += d.content ?? '';
      for (const tc of d.tool_calls ?? []) {
        assertInt(tc.index, 'delta.tool_calls[].index', { min: 0 });
        calls[tc.index] ??= { name: '', arguments: '' };
        calls[tc.index].name += tc.function?.name ?? '';
        calls[tc.index].arguments += tc.function?.arguments ?? '';
      }
    }
    const msg = full.json.choices[0].message;
    assert.equal(content, msg.content ?? '', 'streamed content equals the non-streamed content');
    assert.deepEqual(
      calls.map((c) => ({ name: c.name, arguments: JSON.parse(c.arguments) })),
      (msg.tool_calls ?? []).map((c) => ({ name: c.function.name, arguments: JSON.parse(c.function.arguments) })),
      'streamed tool call deltas assemble to the non-streamed tool_calls',
    );
  });

  test('a history with assistant tool_calls (content null) and tool results renders and is accepted', async () => {
    const history = [
      ...ASK,
      { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city": "Paris"}' } }] },
      { role: 'tool', tool_call_id: 'call_1', content: '18 C, clear' },
    ];
    const r = await srv.post('/v1/chat/completions', { model, messages: history, tools: TOOLS, max_tokens: 8, temperature: 0 });
    assert.equal(r.status, 200, `history with a tool call and its result: ${r.status} ${r.text.slice(0, 300)}`);
    const tok = await srv.post('/tokenize', { messages: history, tools: TOOLS, add_generation_prompt: true, return_token_strs: true });
    assert.equal(tok.status, 200, tok.text.slice(0, 300));
    const rendered = (tok.json.token_strs ?? []).join('');
    if (rendered) {
      assert.match(rendered, /get_weather/, 'the assistant tool call is rendered into the prompt');
      assert.match(rendered, /18 C, clear/, 'the tool result is rendered into the prompt');
    }
  });
});

describe('forced tool_choice (Anthropic)', () => {
  test('{"type": "tool", "name"}: the reply is that tool_use (parsed, or as <tool_call> text)', async (t) => {
    const m = await srv.anthropic().messages.create({ model: ANTHROPIC_MODEL, max_tokens: 24, messages: ASK, tools: ANTHROPIC_TOOLS, tool_choice: { type: 'tool', name: 'get_weather' }, temperature: 0 });
    const uses = m.content.filter((b) => b.type === 'tool_use');
    if (uses.length) {
      assert.equal(uses[0].name, 'get_weather', 'the forced tool is used');
      assert.ok(uses[0].input && typeof uses[0].input === 'object', 'tool_use.input is an object');
      assert.equal(m.stop_reason, 'tool_use', 'a parsed call stops with tool_use');
      t.diagnostic('forced call came back parsed');
    } else {
      const text = m.content.filter((b) => b.type === 'text').map((b) => b.text).join('');
      assert.match(text, FORCED, `no tool_use parsed, so the forced call must come back as text: ${JSON.stringify(m.content)}`);
      assert.notEqual(m.stop_reason, 'tool_use', 'stop_reason tool_use without a tool_use block');
      t.diagnostic('forced call came back as text');
    }
  });

  test('{"type": "any"}: the reply starts a tool call; {"type": "none"}: it is not forced', async () => {
    const any = await srv.anthropic().messages.create({ model: ANTHROPIC_MODEL, max_tokens: 24, messages: ASK, tools: ANTHROPIC_TOOLS, tool_choice: { type: 'any' }, temperature: 0 });
    const usesAny = any.content.filter((b) => b.type === 'tool_use');
    if (!usesAny.length) assert.match(any.content.filter((b) => b.type === 'text').map((b) => b.text).join(''), REQUIRED, `tool_choice any: ${JSON.stringify(any.content)}`);
    const none = await srv.anthropic().messages.create({ model: ANTHROPIC_MODEL, max_tokens: 16, messages: ASK, tools: ANTHROPIC_TOOLS, tool_choice: { type: 'none' }, temperature: 0 });
    assert.ok(!none.content.some((b) => b.type === 'tool_use'), `tool_choice none: no tool_use, got ${JSON.stringify(none.content)}`);
  });
});
