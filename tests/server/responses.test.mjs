// The OpenAI Responses API (POST /v1/responses, GET/DELETE /v1/responses/{id}) through the
// official openai SDK's `responses` client: input strings and items, instructions, function
// tools with a real call from spill-tiny (trained on Hermes-style tool use) and its
// function_call_output coming back, reasoning items as input, streaming with the typed events
// (checked raw and through the SDK's accumulator), previous_response_id against the bounded
// store, usage, and errors.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';

import { assertInt, assertOpenAIError, startServer, unlessTrained } from './helpers.mjs';

// The function calls below are spill-tiny's own (trained), not the client's.
const NEEDS_CALL = unlessTrained('the function call comes from spill-tiny\'s training');

const WEATHER = {
  type: 'function',
  name: 'get_weather',
  description: 'Get the current weather for a city.',
  parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
  strict: false,
};
const READ_FILE = {
  type: 'function',
  name: 'read_file',
  description: 'Read a file.',
  parameters: { type: 'object', properties: { path: { type: 'string' } }, required: ['path'] },
  strict: false,
};
const STORE_SIZE = 3;

let srv;
let client;
let model;

before(async () => {
  srv = await startServer({ args: ['--responses-store', STORE_SIZE] });
  client = srv.openai();
  model = await srv.modelId();
});
after(() => srv?.stop());

function assertResponse(r, what, { maxOutputTokens } = {}) {
  assert.equal(r.object, 'response', `${what}: object`);
  assert.match(r.id, /^resp_/, `${what}: id`);
  assertInt(r.created_at, `${what}: created_at`, { min: 1_600_000_000 });
  assert.ok(['completed', 'incomplete'].includes(r.status), `${what}: status ${r.status}`);
  assert.ok(Array.isArray(r.output), `${what}: output must be an array`);
  for (const item of r.output) {
    assert.ok(['message', 'function_call', 'reasoning'].includes(item.type), `${what}: unexpected item ${JSON.stringify(item)}`);
    assert.equal(typeof item.id, 'string', `${what}: item id`);
    if (item.type === 'message') {
      assert.equal(item.role, 'assistant');
      assert.equal(item.status, 'completed');
      for (const part of item.content) {
        assert.equal(part.type, 'output_text', `${what}: content part ${JSON.stringify(part)}`);
        assert.ok(Array.isArray(part.annotations), `${what}: annotations`);
      }
    }
  }
  assertInt(r.usage.input_tokens, `${what}: usage.input_tokens`, { min: 1 });
  assertInt(r.usage.output_tokens, `${what}: usage.output_tokens`, { min: 0, max: maxOutputTokens });
  assertInt(r.usage.input_tokens_details.cached_tokens, `${what}: cached_tokens`, { min: 0, max: r.usage.input_tokens });
  assertInt(r.usage.output_tokens_details.reasoning_tokens, `${what}: reasoning_tokens`, { min: 0, max: r.usage.output_tokens });
  assert.equal(r.usage.total_tokens, r.usage.input_tokens + r.usage.output_tokens, `${what}: total_tokens`);
  if (r.status === 'incomplete') {
    assert.equal(r.incomplete_details?.reason, 'max_output_tokens', `${what}: incomplete_details`);
    if (maxOutputTokens) assert.equal(r.usage.output_tokens, maxOutputTokens, `${what}: incomplete means the budget ran out`);
  }
}

describe('POST /v1/responses, non-streaming', () => {
  test('a string input and instructions: a completed message with output_text, usage and the request echoed', async () => {
    const r = await client.responses.create({ model, input: 'Write a Python function that reverses a string.', instructions: 'You are a helpful coding assistant.', max_output_tokens: 24, temperature: 0 });
    assertResponse(r, 'string input', { maxOutputTokens: 24 });
    assert.equal(r.instructions, 'You are a helpful coding assistant.');
    assert.equal(r.max_output_tokens, 24);
    const text = r.output.filter((i) => i.type === 'message').flatMap((i) => i.content).map((p) => p.text).join('');
    assert.ok(text.length > 0, `the model wrote text: ${JSON.stringify(r.output)}`);
    assert.equal(r.output_text, text, 'the SDK output_text helper sees the same text');
  });

  test('instructions are part of the prompt: more input tokens than without them', async () => {
    const input = [{ role: 'user', content: [{ type: 'input_text', text: 'Say hello.' }] }];
    const bare = await client.responses.create({ model, input, max_output_tokens: 1, temperature: 0 });
    const withInstructions = await client.responses.create({ model, input, instructions: 'Answer in French, briefly and politely.', max_output_tokens: 1, temperature: 0 });
    assert.ok(withInstructions.usage.input_tokens > bare.usage.input_tokens + 5, `${withInstructions.usage.input_tokens} vs ${bare.usage.input_tokens}`);
  });

  test('max_output_tokens reached: status incomplete, reason max_output_tokens', async () => {
    const r = await client.responses.create({ model, input: 'Write a long essay about compilers.', max_output_tokens: 3, temperature: 0 });
    assertResponse(r, 'tiny budget', { maxOutputTokens: 3 });
    assert.equal(r.status, 'incomplete');
    assert.equal(r.usage.output_tokens, 3);
  });

  test('the model calls a function: a function_call item with call_id and JSON arguments', { skip: NEEDS_CALL }, async () => {
    const r = await client.responses.create({ model, input: 'What is the weather in Paris?', tools: [WEATHER, READ_FILE], max_output_tokens: 64, temperature: 0 });
    assertResponse(r, 'tool call', { maxOutputTokens: 64 });
    assert.equal(r.status, 'completed');
    const calls = r.output.filter((i) => i.type === 'function_call');
    assert.equal(calls.length, 1, JSON.stringify(r.output));
    assert.equal(calls[0].name, 'get_weather');
    assert.match(calls[0].call_id, /^call_/);
    assert.equal(calls[0].status, 'completed');
    assert.deepEqual(JSON.parse(calls[0].arguments), { city: 'Paris' });
    assert.equal(r.tools.length, 2, 'tools echoed');
  });

  test('function_call and function_call_output items go back as input: the call and the result are in the prompt', { skip: NEEDS_CALL }, async () => {
    const first = await client.responses.create({ model, input: 'What is the weather in Paris?', tools: [WEATHER], max_output_tokens: 64, temperature: 0, store: false });
    const call = first.output.find((i) => i.type === 'function_call');
    assert.ok(call, JSON.stringify(first.output));
    const input = [
      { role: 'user', content: 'What is the weather in Paris?' },
      { type: 'reasoning', id: 'rs_1', summary: [], content: [{ type: 'reasoning_text', text: 'The user wants the weather; call the tool.' }] },
      { type: 'function_call', call_id: call.call_id, name: call.name, arguments: call.arguments },
      { type: 'function_call_output', call_id: call.call_id, output: '{"temperature": 18, "unit": "celsius", "conditions": "clear"}' },
    ];
    const second = await client.responses.create({ model, input, tools: [WEATHER], max_output_tokens: 32, temperature: 0, store: false });
    assertResponse(second, 'after the tool result', { maxOutputTokens: 32 });
    assert.ok(second.usage.input_tokens > first.usage.input_tokens + 10, `the call and its output are in the prompt: ${second.usage.input_tokens} vs ${first.usage.input_tokens}`);
    assert.ok(second.usage.input_tokens_details.cached_tokens > 0, 'the shared prefix comes from the prefix cache');
    // The same conversation as chat messages renders to the same prompt length.
    const tokenized = await srv.post('/tokenize', {
      messages: [
        { role: 'user', content: 'What is the weather in Paris?' },
        { role: 'assistant', content: '', reasoning_content: 'The user wants the weather; call the tool.', tool_calls: [{ id: call.call_id, type: 'function', function: { name: call.name, arguments: call.arguments } }] },
        { role: 'tool', tool_call_id: call.call_id, content: '{"temperature": 18, "unit": "celsius", "conditions": "clear"}' },
      ],
      tools: [{ type: 'function', function: { name: WEATHER.name, description: WEATHER.description, parameters: WEATHER.parameters } }],
    });
    assert.equal(tokenized.status, 200, tokenized.text);
    assert.equal(second.usage.input_tokens, tokenized.json.count, 'input items render as the equivalent chat conversation');
  });
});

describe('streaming', () => {
  // Raw events: every one named as its type, sequence numbers 0, 1, 2, ...; created and
  // in_progress first, completed (or incomplete) last; deltas add up to the done texts.
  function checkEvents(events, what) {
    assert.ok(events.length >= 4, `${what}: ${events.length} events`);
    events.forEach((e, i) => {
      assert.ok(e.json, `${what}: event ${i} has JSON data`);
      assert.equal(e.event, e.json.type, `${what}: SSE event name equals data.type`);
      assert.equal(e.json.sequence_number, i, `${what}: sequence_number of event ${i}`);
    });
    assert.equal(events[0].json.type, 'response.created');
    assert.equal(events[0].json.response.status, 'in_progress');
    assert.equal(events[1].json.type, 'response.in_progress');
    const last = events.at(-1).json;
    assert.ok(['response.completed', 'response.incomplete'].includes(last.type), `${what}: last event ${last.type}`);
    const deltas = {};
    for (const { json } of events) {
      if (json.type === 'response.output_text.delta') deltas[json.item_id] = (deltas[json.item_id] ?? '') + json.delta;
      if (json.type === 'response.output_text.done') assert.equal(json.text, deltas[json.item_id] ?? '', `${what}: output_text.done equals the deltas`);
    }
    return last.response;
  }

  test('text: the event sequence, and the SDK stream assembles the same response', async () => {
    const body = { model, input: 'Write a haiku about the sea.', max_output_tokens: 20, temperature: 0, stream: true };
    const events = (await srv.stream('/v1/responses', body)).events;
    const final = checkEvents(events, 'raw text stream');
    assertResponse(final, 'final response', { maxOutputTokens: 20 });
    const types = events.map((e) => e.json.type);
    for (const t of ['response.output_item.added', 'response.content_part.added', 'response.output_text.delta', 'response.output_text.done', 'response.content_part.done', 'response.output_item.done'])
      assert.ok(types.includes(t), `${t} in ${types.join(', ')}`);

    const stream = client.responses.stream({ ...body, stream: undefined });
    let deltaText = '';
    stream.on('response.output_text.delta', (e) => {
      deltaText += e.delta;
    });
    const r = await stream.finalResponse();
    assertResponse(r, 'SDK stream', { maxOutputTokens: 20 });
    assert.equal(r.output_text, deltaText, 'SDK output_text equals the deltas');
    const nonStreamed = await client.responses.create({ ...body, stream: false });
    assert.equal(r.output_text, nonStreamed.output_text, 'greedy: streamed and non-streamed text agree');
  });

  test('a function call streams as output_item.added, arguments delta/done, output_item.done', { skip: NEEDS_CALL }, async () => {
    const body = { model, input: 'Read the file src/main.py', tools: [WEATHER, READ_FILE], max_output_tokens: 64, temperature: 0 };
    const events = (await srv.stream('/v1/responses', { ...body, stream: true })).events;
    const final = checkEvents(events, 'tool stream');
    const call = final.output.find((i) => i.type === 'function_call');
    assert.ok(call, JSON.stringify(final.output));
    assert.equal(call.name, 'read_file');
    assert.deepEqual(JSON.parse(call.arguments), { path: 'src/main.py' });
    const done = events.find((e) => e.json.type === 'response.function_call_arguments.done');
    assert.equal(done.json.arguments, call.arguments);
    const sdk = await client.responses.stream(body).finalResponse();
    const sdkCall = sdk.output.find((i) => i.type === 'function_call');
    assert.equal(sdkCall?.name, 'read_file');
    assert.deepEqual(JSON.parse(sdkCall.arguments), { path: 'src/main.py' });
  });
});

describe('previous_response_id and the store', () => {
  test('a stored response continues: the conversation comes back, the tool result goes on top', { skip: NEEDS_CALL }, async () => {
    const first = await client.responses.create({ model, input: 'What is the weather in Paris?', tools: [WEATHER], max_output_tokens: 64, temperature: 0 });
    const call = first.output.find((i) => i.type === 'function_call');
    assert.ok(call, JSON.stringify(first.output));
    const second = await client.responses.create({
      model,
      previous_response_id: first.id,
      input: [{ type: 'function_call_output', call_id: call.call_id, output: '{"temperature": 18}' }],
      tools: [WEATHER],
      max_output_tokens: 16,
      temperature: 0,
    });
    assertResponse(second, 'continued', { maxOutputTokens: 16 });
    assert.equal(second.previous_response_id, first.id);
    assert.ok(second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens, 'the earlier turn is in the prompt');
    assert.ok(second.usage.input_tokens_details.cached_tokens > 0, 'and reads the prefix cache');

    const got = await client.responses.retrieve(first.id);
    assert.equal(got.id, first.id);
    assert.deepEqual(got.output, first.output, 'GET returns the stored response');
  });

  test('store: false is not kept; unknown ids are 404; the store keeps only the newest --responses-store', async () => {
    const unstored = await client.responses.create({ model, input: 'Hi', max_output_tokens: 2, temperature: 0, store: false });
    const r404 = await srv.post('/v1/responses', { model, input: 'Hi', previous_response_id: unstored.id, max_output_tokens: 2 });
    const e = assertOpenAIError(r404, 404, 'previous_response_id of an unstored response');
    assert.equal(e.param, 'previous_response_id');
    assert.equal((await srv.get(`/v1/responses/${unstored.id}`)).status, 404);

    const ids = [];
    for (let i = 0; i < STORE_SIZE + 1; ++i) ids.push((await client.responses.create({ model, input: `Count to ${i}`, max_output_tokens: 1, temperature: 0 })).id);
    assert.equal((await srv.get(`/v1/responses/${ids[0]}`)).status, 404, 'the oldest was evicted');
    for (const id of ids.slice(1)) assert.equal((await srv.get(`/v1/responses/${id}`)).status, 200, `${id} kept`);

    const del = await srv.request('DELETE', `/v1/responses/${ids.at(-1)}`);
    assert.equal(del.status, 200);
    assert.equal(del.json.deleted, true);
    assert.equal((await srv.get(`/v1/responses/${ids.at(-1)}`)).status, 404, 'deleted');
  });
});

describe('errors', () => {
  test('bad input items are 400s that name the field', async () => {
    const cases = [
      [{ model }, 'input'],
      [{ model, input: 7 }, 'input'],
      [{ model, input: [{ type: 'function_call_output', output: 'x' }] }, 'input[0].call_id'],
      [{ model, input: [{ role: 'robot', content: 'x' }] }, 'input[0].role'],
      [{ model, input: [{ role: 'user', content: [{ type: 'input_image', image_url: 'x' }] }] }, 'input[0].content[0].type'],
      [{ model, input: 'x', text: { format: { type: 'json_schema', name: 'x', schema: {} } } }, 'text.format.type'],
      [{ model, input: 'x', tool_choice: 'required' }, 'tool_choice'],
      [{ model, input: 'x', max_output_tokens: 0 }, 'max_output_tokens'],
    ];
    for (const [body, param] of cases) {
      const r = await srv.post('/v1/responses', body);
      const e = assertOpenAIError(r, 400, JSON.stringify(body));
      assert.equal(e.param, param, `${JSON.stringify(body)}: param ${e.param}`);
    }
  });
});
