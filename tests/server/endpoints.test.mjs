// Operational and utility endpoints: GET /health, GET /metrics (Prometheus text, spill: names),
// GET /v1/models (and the SDK's models API), POST /tokenize and POST /detokenize.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';

import { assertInt, kvUsage, requestsRunning, requestsWaiting, startServer } from './helpers.mjs';

let srv;
let model;

before(async () => {
  srv = await startServer();
  model = await srv.modelId();
});
after(() => srv?.stop());

describe('GET /health', () => {
  test('200 once the model is loaded', async () => {
    const r = await srv.get('/health');
    assert.equal(r.status, 200, `/health: ${r.status} ${r.text.slice(0, 200)}`);
  });
});

describe('GET /v1/models', () => {
  test('a list with the served model: id without "/", object "model", a context length', async () => {
    const r = await srv.get('/v1/models');
    assert.equal(r.status, 200, `/v1/models: ${r.status}`);
    assert.match(r.headers.get('content-type') ?? '', /application\/json/, '/v1/models content-type');
    assert.equal(r.json.object, 'list', `/v1/models object: ${r.text.slice(0, 300)}`);
    assert.ok(Array.isArray(r.json.data) && r.json.data.length >= 1, `/v1/models data must list the model: ${r.text.slice(0, 300)}`);
    const m = r.json.data[0];
    assert.equal(typeof m.id, 'string', 'model id');
    assert.ok(m.id.length > 0, 'model id must not be empty');
    assert.ok(!m.id.includes('/'), `model id must be a name, not a path: ${JSON.stringify(m.id)}`);
    assert.equal(m.object, 'model', 'data[0].object');
    assertInt(m.created, 'data[0].created', { min: 0 });
    assert.equal(typeof m.owned_by, 'string', 'data[0].owned_by');
    const len = m.max_model_len ?? m.context_length ?? m.context_window ?? m.max_context_length;
    assertInt(len, `data[0] context length (max_model_len / context_length): ${JSON.stringify(m)}`, { min: 128 });
  });

  test('the openai SDK lists the model (models.list)', async () => {
    const ids = [];
    for await (const m of srv.openai().models.list()) ids.push(m.id);
    assert.ok(ids.includes(model), `models.list() must include ${model}: ${ids}`);
  });

  test('GET /v1/models/{id} retrieves the model (the SDK\'s models.retrieve)', async () => {
    const r = await srv.get(`/v1/models/${encodeURIComponent(model)}`);
    assert.equal(r.status, 200, `GET /v1/models/${model} (OpenAI "retrieve model"): expected 200, got ${r.status}: ${r.text.slice(0, 200)}`);
    const one = await srv.openai().models.retrieve(model);
    assert.equal(one.id, model, 'models.retrieve(id).id');
    assert.equal(one.object, 'model', 'models.retrieve(id).object');
    const missing = await srv.get('/v1/models/no-such-model');
    assert.equal(missing.status, 404, `GET /v1/models/no-such-model: expected 404, got ${missing.status}`);
  });
});

describe('GET /metrics', () => {
  test('Prometheus text with spill: metric names; idle server: KV usage, running and waiting are 0', async () => {
    const m = await srv.metrics();
    assert.match(m.contentType ?? '', /^text\/plain/, `/metrics content-type must be text/plain (Prometheus text format), got ${m.contentType}`);
    const spillNames = [...m.names].filter((n) => n.startsWith('spill:'));
    assert.ok(spillNames.length >= 3, `/metrics must expose spill: metrics, found: ${spillNames.join(', ') || '(none)'}`);
    for (const g of [kvUsage(m), requestsRunning(m), requestsWaiting(m)]) {
      assert.equal(g.value, 0, `idle server: ${g.name} must be 0, got ${g.value}`);
      const type = m.types.get(g.name);
      assert.ok(type === undefined || type === 'gauge', `${g.name} is declared as ${type}, expected gauge`);
    }
  });

  test('counters move: after a request some spill: counter has grown', async () => {
    const before = await srv.metrics();
    const counters = (m) => new Map(m.samples.filter((s) => s.name.startsWith('spill:') && (m.types.get(s.name) === 'counter' || /_total$/.test(s.name))).map((s) => [`${s.name}${JSON.stringify(s.labels)}`, s.value]));
    const c0 = counters(before);
    const r = await srv.post('/v1/completions', { model, prompt: 'def square(x):\n', max_tokens: 4 });
    assert.equal(r.status, 200, `request: ${r.status}`);
    const c1 = counters(await srv.metrics());
    const grown = [...c1].filter(([k, v]) => v > (c0.get(k) ?? 0)).map(([k]) => k);
    assert.ok(grown.length > 0, `no spill: counter grew after a request; counters: ${[...c1.keys()].join(', ') || '(none)'}`);
  });
});

describe('POST /tokenize and /detokenize', () => {
  const texts = ['def hello(name):\n    return f"Hello, {name}!"\n', 'naïve café: 数据, emoji 🚀, tabs\tand  spaces', ' leading space and trailing newline\n\n'];

  async function tokenize(prompt, extra = {}) {
    const r = await srv.post('/tokenize', { model, prompt, ...extra });
    assert.equal(r.status, 200, `/tokenize: ${r.status} ${r.text.slice(0, 300)}`);
    const tokens = r.json?.tokens;
    assert.ok(Array.isArray(tokens) && tokens.length > 0, `/tokenize must return {"tokens": [ids...]}: ${r.text.slice(0, 300)}`);
    for (const id of tokens) assertInt(id, '/tokenize token id', { min: 0 });
    if (r.json.count !== undefined) assert.equal(r.json.count, tokens.length, '/tokenize count equals tokens.length');
    return tokens;
  }

  async function detokenize(tokens) {
    const r = await srv.post('/detokenize', { model, tokens });
    assert.equal(r.status, 200, `/detokenize: ${r.status} ${r.text.slice(0, 300)}`);
    const text = r.json?.prompt ?? r.json?.text ?? r.json?.content;
    assert.equal(typeof text, 'string', `/detokenize must return the text (as "prompt"): ${r.text.slice(0, 300)}`);
    return text;
  }

  test('round trip: detokenize(tokenize(text)) == text, ASCII and Unicode', async () => {
    for (const text of texts) {
      const tokens = await tokenize(text, { add_special_tokens: false });
      assert.equal(await detokenize(tokens), text, `round trip of ${JSON.stringify(text)} through ${tokens.length} tokens`);
    }
  });

  test('/tokenize counts what the completions endpoint counts as prompt_tokens', async () => {
    const tokens = await tokenize(texts[0]);
    const r = await srv.post('/v1/completions', { model, prompt: texts[0], max_tokens: 1 });
    assert.equal(r.status, 200, `completion: ${r.status}`);
    assert.equal(tokens.length, r.json.usage.prompt_tokens, '/tokenize length (default special tokens) equals usage.prompt_tokens for the same prompt');
  });

  test('bad input: 400', async () => {
    const a = await srv.post('/tokenize', '{"prompt": ');
    assert.equal(a.status, 400, `/tokenize malformed JSON: ${a.status}`);
    const b = await srv.post('/detokenize', { model, tokens: ['not', 'ids'] });
    assert.equal(b.status, 400, `/detokenize with non-integer tokens: ${b.status}`);
    const c = await srv.post('/detokenize', { model, tokens: [1e12] });
    assert.equal(c.status, 400, `/detokenize with an id outside the vocabulary: ${c.status} ${c.text.slice(0, 200)}`);
  });
});

describe('shutdown', () => {
  // docs/API.md: SIGINT/SIGTERM stop the server; open requests are cancelled, streams end.
  test('SIGTERM with a stream open: the stream ends and the process exits with status 0 within 10 s', { timeout: 60_000 }, async () => {
    const own = await startServer();
    try {
      let events = 0;
      let resolveStarted;
      const started = new Promise((r) => {
        resolveStarted = r;
      });
      const stream = own
        .stream('/v1/completions', { prompt: 'def main():\n', max_tokens: 1500, temperature: 0, stream: true, ignore_eos: true }, {
          onEvent: () => {
            if (++events === 3) resolveStarted();
          },
        })
        .then(
          (r) => ({ ok: r }),
          (e) => ({ err: e }),
        );
      await Promise.race([started, stream]);
      const t0 = Date.now();
      own.proc.kill('SIGTERM');
      const exit = await Promise.race([own.exited, new Promise((r) => setTimeout(() => r(null), 10_000).unref())]);
      assert.ok(exit, `the server did not exit within 10 s of SIGTERM\n${own.diagnostics(10)}`);
      assert.equal(exit.code, 0, `exit status after SIGTERM: ${JSON.stringify(exit)}\n${own.diagnostics(10)}`);
      const outcome = await Promise.race([stream, new Promise((r) => setTimeout(() => r(null), 5_000).unref())]);
      assert.ok(outcome, 'the open stream did not end after the server stopped');
      assert.ok(Date.now() - t0 < 15_000);
    } finally {
      await own.stop();
    }
  });
});
