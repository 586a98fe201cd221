// --api-key: requests without the key, or with a wrong one, get 401 in the API's own error shape;
// the right key works as `Authorization: Bearer KEY` and as `x-api-key: KEY`, with both SDKs.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';

import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';

import { ANTHROPIC_MODEL, assertAnthropicError, assertOpenAIError, startServer } from './helpers.mjs';

const KEY = 'spill-test-key-3f9c1a';
const CHAT = [{ role: 'user', content: 'def add(a, b):' }];
const ANTHROPIC_VERSION = { 'anthropic-version': '2023-06-01' };

let srv;
let model;

before(async () => {
  srv = await startServer({ args: ['--api-key', KEY] });
  model = await srv.modelId({ authorization: `Bearer ${KEY}` });
});
after(() => srv?.stop());

const chatBody = () => ({ model, messages: CHAT, max_tokens: 2, temperature: 0 });
const messagesBody = () => ({ model: ANTHROPIC_MODEL, messages: CHAT, max_tokens: 2, temperature: 0 });

describe('OpenAI endpoints with --api-key', () => {
  const wrong = [
    ['no key', {}],
    ['wrong Bearer', { authorization: 'Bearer not-the-key' }],
    ['wrong x-api-key', { 'x-api-key': 'not-the-key' }],
    ['Bearer with an empty key', { authorization: 'Bearer ' }],
    ['the key without "Bearer"', { authorization: KEY }],
    ['a prefix of the key', { authorization: `Bearer ${KEY.slice(0, -1)}` }],
  ];

  test('missing or wrong key: 401 with the OpenAI error shape', async () => {
    for (const [what, headers] of wrong) {
      assertOpenAIError(await srv.post('/v1/chat/completions', chatBody(), { headers }), 401, `chat completions, ${what}`);
      assertOpenAIError(await srv.post('/v1/completions', { model, prompt: 'x', max_tokens: 1 }, { headers }), 401, `completions, ${what}`);
      assertOpenAIError(await srv.get('/v1/models', { headers }), 401, `GET /v1/models, ${what}`);
    }
  });

  test('the key is checked before the body is parsed: malformed JSON without a key is 401', async () => {
    assertOpenAIError(await srv.post('/v1/chat/completions', '{"model": ['), 401, 'malformed body, no key');
  });

  test('right key as Bearer or as x-api-key: 200', async () => {
    for (const headers of [{ authorization: `Bearer ${KEY}` }, { 'x-api-key': KEY }]) {
      const r = await srv.post('/v1/chat/completions', chatBody(), { headers });
      assert.equal(r.status, 200, `right key via ${Object.keys(headers)[0]}: expected 200, got ${r.status}: ${r.text.slice(0, 300)}`);
      const m = await srv.get('/v1/models', { headers });
      assert.equal(m.status, 200, `GET /v1/models with the right key via ${Object.keys(headers)[0]}: ${m.status}`);
    }
  });

  test('the openai SDK: right key works, wrong key raises AuthenticationError', async () => {
    const good = await srv.openai({ apiKey: KEY }).chat.completions.create(chatBody());
    assert.equal(good.object, 'chat.completion');
    await assert.rejects(srv.openai({ apiKey: 'wrong' }).chat.completions.create(chatBody()), (e) => {
      assert.ok(e instanceof OpenAI.AuthenticationError, `expected AuthenticationError, got ${e?.constructor?.name}: ${e?.message}`);
      assert.equal(e.status, 401);
      return true;
    });
  });
});

describe('Messages API with --api-key', () => {
  test('missing or wrong key: 401 authentication_error in the Anthropic shape', async () => {
    for (const [what, headers] of [
      ['no key', {}],
      ['wrong x-api-key', { 'x-api-key': 'not-the-key' }],
      ['wrong Bearer', { authorization: 'Bearer not-the-key' }],
    ]) {
      const r = await srv.post('/v1/messages', messagesBody(), { headers: { ...ANTHROPIC_VERSION, ...headers } });
      assertAnthropicError(r, 401, 'authentication_error', `/v1/messages, ${what}`);
      const c = await srv.post('/v1/messages/count_tokens', { model: ANTHROPIC_MODEL, messages: CHAT }, { headers: { ...ANTHROPIC_VERSION, ...headers } });
      assertAnthropicError(c, 401, 'authentication_error', `/v1/messages/count_tokens, ${what}`);
    }
  });

  test('right key as x-api-key or Bearer: 200', async () => {
    for (const headers of [{ 'x-api-key': KEY }, { authorization: `Bearer ${KEY}` }]) {
      const r = await srv.post('/v1/messages', messagesBody(), { headers: { ...ANTHROPIC_VERSION, ...headers } });
      assert.equal(r.status, 200, `right key via ${Object.keys(headers)[0]}: expected 200, got ${r.status}: ${r.text.slice(0, 300)}`);
    }
  });

  test('the Anthropic SDK: right key works (x-api-key), wrong key raises AuthenticationError', async () => {
    const good = await srv.anthropic({ apiKey: KEY }).messages.create(messagesBody());
    assert.equal(good.type, 'message');
    const bearer = await srv.anthropic({ apiKey: null, authToken: KEY }).messages.create(messagesBody());
    assert.equal(bearer.type, 'message', 'Anthropic SDK with authToken (Authorization: Bearer)');
    await assert.rejects(srv.anthropic({ apiKey: 'wrong' }).messages.create(messagesBody()), (e) => {
      assert.ok(e instanceof Anthropic.AuthenticationError, `expected AuthenticationError, got ${e?.constructor?.name}: ${e?.message}`);
      assert.equal(e.status, 401);
      return true;
    });
  });
});

describe('operational endpoints with --api-key', () => {
  test('/health stays open for load balancers (200 without a key)', async () => {
    const r = await srv.get('/health');
    assert.equal(r.status, 200, `GET /health without a key: expected 200, got ${r.status}`);
  });
});
