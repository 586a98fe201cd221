// Shared helpers for the black-box HTTP tests: start a real `spill serve`, talk to it over HTTP
// (raw fetch, raw sockets, the official SDKs), read SSE streams and Prometheus metrics.
//
// Environment (run.sh sets SPILL_BIN from its first argument):
//   SPILL_BIN                      the spill executable (required)
//   SPILL_TEST_MODEL               model folder passed as --model (default: the binary's bundled spill-tiny)
//   SPILL_TEST_SERVER_ARGS         extra flags for every `spill serve`, split on whitespace
//   SPILL_TEST_STARTUP_TIMEOUT_MS  how long a server may take to listen and report healthy (default 180000)
//   SPILL_TEST_VERBOSE=1           forward the servers' stderr to this process's stderr
import assert from 'node:assert/strict';
import { execFileSync, spawn } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { performance } from 'node:perf_hooks';
import { createInterface } from 'node:readline';
import { setTimeout as sleep } from 'node:timers/promises';

import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';

// A random-weight model (run.sh with SPILL_TEST_FAMILY, random_model.mjs): its text is noise and its
// tokenizer has no merges. Tests that need the bundled spill-tiny's trained answers skip themselves
// on it, each saying why (the reporter lists them as skipped, never silently passed).
export const RANDOM_MODEL = process.env.SPILL_TEST_RANDOM_MODEL === '1';
// The `skip` option of such a test: false on a trained model, the reason on a random one.
export function unlessTrained(why) {
  return RANDOM_MODEL ? `a random-weight model cannot: ${why}` : false;
}

export const STARTUP_TIMEOUT_MS = Number(process.env.SPILL_TEST_STARTUP_TIMEOUT_MS || 180_000);
// One request to the tiny model on a 2-core CPU takes well under a second; this only bounds a hang.
export const REQUEST_TIMEOUT_MS = 120_000;
// Any name is accepted on the Messages API (clients such as Claude Code send their own).
export const ANTHROPIC_MODEL = 'claude-sonnet-4-6';

const LISTENING_RE = /^spill: listening on (http:\/\/\S+?)\/?\s*$/;
const VERBOSE = process.env.SPILL_TEST_VERBOSE === '1';

// Servers still running; killed when this test file's process exits for any reason.
const liveServers = new Set();
process.on('exit', () => {
  for (const s of liveServers) {
    try {
      s.proc.kill('SIGKILL');
    } catch {
      // already gone
    }
  }
});
for (const sig of ['SIGINT', 'SIGTERM', 'SIGHUP']) {
  process.once(sig, () => process.exit(128 + 2));
}

export function spillBinary() {
  const bin = process.env.SPILL_BIN;
  if (!bin) throw new Error('SPILL_BIN is not set: run the suite with tests/server/run.sh path/to/spill');
  return bin;
}

// The model the servers load: SPILL_TEST_MODEL, else the bundled spill-tiny of this checkout.
export function testModelDir() {
  return process.env.SPILL_TEST_MODEL || path.resolve(import.meta.dirname ?? path.dirname(new URL(import.meta.url).pathname), '../../models/spill-tiny');
}

/**
 * A temporary copy of the test model without a chat template (weights and tokenizer symlinked,
 * tokenizer_config.json rewritten), so that spill falls back to ChatML with a Hermes-style tools
 * section (docs/API.md). Returns {dir, remove()}.
 */
export function modelWithoutChatTemplate() {
  const src = testModelDir();
  assert.ok(fs.existsSync(path.join(src, 'config.json')), `test model not found at ${src} (set SPILL_TEST_MODEL)`);
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'spill-notemplate-'));
  for (const name of fs.readdirSync(src)) {
    if (name === 'chat_template.jinja' || name === 'chat_template.json') continue;
    if (name === 'tokenizer_config.json') {
      const cfg = JSON.parse(fs.readFileSync(path.join(src, name), 'utf8'));
      delete cfg.chat_template;
      fs.writeFileSync(path.join(dir, name), JSON.stringify(cfg, null, 2));
    } else {
      fs.symlinkSync(path.resolve(src, name), path.join(dir, name));
    }
  }
  return { dir, remove: () => fs.rmSync(dir, { recursive: true, force: true }) };
}

let helpText;
// The text of `spill serve --help` (empty if the command fails), to discover optional flags.
export function serveHelp() {
  if (helpText === undefined) {
    try {
      helpText = execFileSync(spillBinary(), ['serve', '--help'], { encoding: 'utf8', timeout: 30_000, stdio: ['ignore', 'pipe', 'pipe'] });
    } catch (e) {
      helpText = `${e.stdout ?? ''}${e.stderr ?? ''}`;
    }
  }
  return helpText;
}

// The first `spill serve` flag in the help text that matches re, or null.
export function findServeFlag(re) {
  for (const m of serveHelp().matchAll(/(--[a-z0-9][a-z0-9-]*)/g)) {
    if (re.test(m[1])) return m[1];
  }
  return null;
}

/**
 * Starts `spill serve --port 0 ...args`, waits for its "listening" line and a 200 from /health.
 * Call stop() when done (an `after` hook); the process is also killed when the test process exits.
 */
export async function startServer({ args = [], model, timeoutMs = STARTUP_TIMEOUT_MS } = {}) {
  const argv = ['serve'];
  const modelDir = model ?? process.env.SPILL_TEST_MODEL;
  if (modelDir) argv.push('--model', modelDir);
  argv.push('--port', '0');
  if (process.env.SPILL_TEST_SERVER_ARGS) argv.push(...process.env.SPILL_TEST_SERVER_ARGS.trim().split(/\s+/));
  argv.push(...args.map(String));
  const server = new SpillServer(spillBinary(), argv);
  try {
    await server.waitReady(timeoutMs);
  } catch (e) {
    await server.stop();
    throw e;
  }
  return server;
}

export class SpillServer {
  constructor(bin, argv) {
    this.command = [bin, ...argv].join(' ');
    this.stderrLines = [];
    this.stdoutLines = [];
    this.url = null;
    this.exit = null; // {code, signal} once the process has ended
    this.stopping = false;
    this.proc = spawn(bin, argv, { stdio: ['ignore', 'pipe', 'pipe'] });
    liveServers.add(this);
    this.exited = new Promise((resolve) => {
      this.proc.on('exit', (code, signal) => {
        this.exit = { code, signal };
        liveServers.delete(this);
        resolve(this.exit);
      });
      this.proc.on('error', (err) => {
        this.exit = { code: null, signal: null, error: err };
        liveServers.delete(this);
        resolve(this.exit);
      });
    });
    this.listening = new Promise((resolve) => {
      createInterface({ input: this.proc.stdout }).on('line', (line) => {
        this.stdoutLines.push(line);
        const m = LISTENING_RE.exec(line);
        if (m && !this.url) {
          this.url = reachableUrl(m[1]);
          resolve(this.url);
        }
      });
    });
    createInterface({ input: this.proc.stderr }).on('line', (line) => {
      this.stderrLines.push(line);
      if (this.stderrLines.length > 400) this.stderrLines.splice(0, 200);
      if (VERBOSE) process.stderr.write(`[spill ${this.proc.pid}] ${line}\n`);
    });
  }

  // Last lines of the server's stderr and its exit status, for assertion messages.
  diagnostics(nLines = 40) {
    const status = this.exit ? `server exited (code ${this.exit.code}, signal ${this.exit.signal}${this.exit.error ? `, ${this.exit.error.message}` : ''})` : 'server still running';
    const tail = this.stderrLines.slice(-nLines).join('\n');
    return `${status}; command: ${this.command}\n--- server stderr (last ${nLines} lines) ---\n${tail || '(empty)'}\n---`;
  }

  async waitReady(timeoutMs) {
    const deadline = Date.now() + timeoutMs;
    const timeout = sleep(timeoutMs, 'timeout', { ref: false });
    const first = await Promise.race([this.listening, this.exited.then(() => 'exited'), timeout]);
    if (first === 'exited') throw new Error(`spill serve exited before printing "spill: listening on http://HOST:PORT".\n${this.diagnostics()}`);
    if (first === 'timeout') {
      throw new Error(`spill serve did not print "spill: listening on http://HOST:PORT" within ${timeoutMs} ms; stdout so far: ${JSON.stringify(this.stdoutLines.slice(-5))}\n${this.diagnostics()}`);
    }
    let last = 'no response';
    while (Date.now() < deadline) {
      if (this.exit) throw new Error(`spill serve exited while loading.\n${this.diagnostics()}`);
      try {
        const res = await fetch(`${this.url}/health`, { signal: AbortSignal.timeout(10_000) });
        await res.arrayBuffer();
        if (res.status === 200) return;
        last = `HTTP ${res.status}`;
        assert.ok(res.status === 503, `/health while loading must be 503 (or 200 when ready), got ${res.status}`);
      } catch (e) {
        if (e instanceof assert.AssertionError) throw e;
        last = String(e.cause ?? e);
      }
      await sleep(200);
    }
    throw new Error(`/health did not return 200 within ${timeoutMs} ms (last: ${last}).\n${this.diagnostics()}`);
  }

  // SIGTERM, then SIGKILL after graceMs. Safe to call twice.
  async stop(graceMs = 15_000) {
    if (this.exit) return this.exit;
    this.stopping = true;
    this.proc.kill('SIGTERM');
    const done = await Promise.race([this.exited, sleep(graceMs, null, { ref: false })]);
    if (done) return done;
    this.proc.kill('SIGKILL');
    return this.exited;
  }

  // fetch against this server; a network error is rethrown with the server's state and stderr.
  async fetch(path, init = {}) {
    try {
      const timeout = AbortSignal.timeout(REQUEST_TIMEOUT_MS);
      return await fetch(`${this.url}${path}`, { ...init, signal: init.signal ? AbortSignal.any([timeout, init.signal]) : timeout });
    } catch (e) {
      if (e.name === 'AbortError' && init.signal?.aborted) throw e;
      throw new Error(`${init.method ?? 'GET'} ${path} failed: ${e.cause?.message ?? e.message}\n${this.diagnostics()}`, { cause: e });
    }
  }

  /**
   * Sends a request and reads the whole body. body: an object (sent as JSON) or a string (sent as is).
   * Returns {status, headers, text, json} (json undefined when the body is not JSON).
   */
  async request(method, path, body, { headers = {}, signal } = {}) {
    const init = { method, headers: { ...headers } };
    if (signal) init.signal = signal;
    if (body !== undefined) {
      init.body = typeof body === 'string' ? body : JSON.stringify(body);
      if (!Object.keys(init.headers).some((h) => h.toLowerCase() === 'content-type')) init.headers['content-type'] = 'application/json';
    }
    const res = await this.fetch(path, init);
    const text = await res.text();
    let json;
    try {
      json = JSON.parse(text);
    } catch {
      json = undefined;
    }
    return { status: res.status, headers: res.headers, text, json };
  }

  post(path, body, opts) {
    return this.request('POST', path, body, opts);
  }

  get(path, opts) {
    return this.request('GET', path, undefined, opts);
  }

  /**
   * POSTs body and reads the response as server-sent events, timing each event from the send.
   * Returns {status, headers, events: [{event, data, json, t}], trailing, text (non-200 only), json}.
   * onEvent(ev) may return false to stop reading (the request is then aborted).
   */
  async stream(path, body, { headers = {}, onEvent, signal } = {}) {
    const controller = new AbortController();
    const abortFromOutside = () => controller.abort();
    signal?.addEventListener('abort', abortFromOutside);
    const t0 = performance.now();
    const res = await this.fetch(path, {
      method: 'POST',
      headers: { 'content-type': 'application/json', ...headers },
      body: JSON.stringify(body),
      signal: controller.signal,
    });
    const out = { status: res.status, headers: res.headers, events: [], trailing: '', t0 };
    if (res.status !== 200) {
      out.text = await res.text();
      try {
        out.json = JSON.parse(out.text);
      } catch {
        out.json = undefined;
      }
      return out;
    }
    const decoder = new TextDecoder();
    let buf = '';
    let stopped = false;
    try {
      for await (const chunk of res.body) {
        buf += decoder.decode(chunk, { stream: true });
        buf = buf.replace(/\r\n/g, '\n');
        let i;
        while (!stopped && (i = buf.indexOf('\n\n')) >= 0) {
          const ev = parseSSEBlock(buf.slice(0, i), performance.now() - t0);
          buf = buf.slice(i + 2);
          if (!ev) continue;
          out.events.push(ev);
          if (onEvent && onEvent(ev) === false) stopped = true;
        }
        if (stopped) {
          controller.abort();
          break;
        }
      }
    } catch (e) {
      if (!(stopped || signal?.aborted)) throw new Error(`reading the event stream of POST ${path} failed: ${e.message}\n${this.diagnostics()}`, { cause: e });
    } finally {
      signal?.removeEventListener('abort', abortFromOutside);
    }
    out.trailing = buf;
    out.aborted = stopped || Boolean(signal?.aborted);
    return out;
  }

  openai({ apiKey = 'sk-spill-test', ...rest } = {}) {
    return new OpenAI({ baseURL: `${this.url}/v1`, apiKey, maxRetries: 0, timeout: REQUEST_TIMEOUT_MS, ...rest });
  }

  anthropic({ apiKey = 'sk-ant-spill-test', ...rest } = {}) {
    return new Anthropic({ baseURL: this.url, apiKey, maxRetries: 0, timeout: REQUEST_TIMEOUT_MS, ...rest });
  }

  // The id of the first model in GET /v1/models (what the OpenAI endpoints are called with).
  async modelId(headers = {}) {
    if (this.cachedModelId) return this.cachedModelId;
    const r = await this.get('/v1/models', { headers });
    assert.equal(r.status, 200, `GET /v1/models: expected 200, got ${r.status}: ${r.text.slice(0, 300)}`);
    const id = r.json?.data?.[0]?.id;
    assert.equal(typeof id, 'string', `GET /v1/models: data[0].id must be a string, got ${r.text.slice(0, 300)}`);
    this.cachedModelId = id;
    return id;
  }

  async metrics(headers = {}) {
    const r = await this.get('/metrics', { headers });
    assert.equal(r.status, 200, `GET /metrics: expected 200, got ${r.status}: ${r.text.slice(0, 300)}`);
    return Object.assign(parsePrometheus(r.text), { contentType: r.headers.get('content-type') });
  }

  /**
   * Polls /metrics until the KV usage gauge is 0 and no request is running or waiting.
   * Returns the last snapshot; throws with the last values after timeoutMs.
   */
  async waitIdle({ timeoutMs = 15_000, what = 'server' } = {}) {
    const deadline = Date.now() + timeoutMs;
    let last;
    for (;;) {
      const m = await this.metrics();
      last = { kv: kvUsage(m), running: requestsRunning(m), waiting: requestsWaiting(m) };
      if (last.kv.value === 0 && last.running.value === 0 && last.waiting.value === 0) return last;
      if (Date.now() > deadline) {
        throw new assert.AssertionError({
          message:
            `${what}: /metrics did not return to idle within ${timeoutMs} ms: ` +
            `${last.kv.name}=${last.kv.value}, ${last.running.name}=${last.running.value}, ${last.waiting.name}=${last.waiting.value} ` +
            '(expected all 0: every KV block freed, nothing running or waiting)',
        });
      }
      await sleep(100);
    }
  }
}

// 0.0.0.0 / :: are listen addresses, not destinations.
function reachableUrl(url) {
  const u = new URL(url);
  if (u.hostname === '0.0.0.0') u.hostname = '127.0.0.1';
  if (u.hostname === '[::]') u.hostname = '[::1]';
  return u.toString().replace(/\/$/, '');
}

function parseSSEBlock(block, t) {
  let event;
  const data = [];
  for (const line of block.split('\n')) {
    if (line === '' || line.startsWith(':')) continue;
    const colon = line.indexOf(':');
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? '' : line.slice(colon + 1);
    if (value.startsWith(' ')) value = value.slice(1);
    if (field === 'event') event = value;
    else if (field === 'data') data.push(value);
  }
  if (event === undefined && data.length === 0) return null; // comment / keep-alive
  const ev = { event, data: data.join('\n'), t };
  try {
    ev.json = JSON.parse(ev.data);
  } catch {
    ev.json = undefined;
  }
  return ev;
}

/**
 * POSTs over a raw socket so a response can be read even if the server answers before it has
 * read the whole body (e.g. 413). Sends the body in 1 MiB pieces and stops once a response arrives.
 * Returns {status, head, body}.
 */
export function rawPost(baseUrl, path, headers, body) {
  const u = new URL(baseUrl);
  return new Promise((resolve, reject) => {
    const sock = net.connect({ host: u.hostname.replace(/^\[|\]$/g, ''), port: Number(u.port) });
    let received = Buffer.alloc(0);
    let settled = false;
    const finish = (err) => {
      if (settled) return;
      const text = received.toString('latin1');
      const m = /^HTTP\/1\.[01] (\d{3})/.exec(text);
      if (m) {
        settled = true;
        const split = text.indexOf('\r\n\r\n');
        resolve({ status: Number(m[1]), head: split < 0 ? text : text.slice(0, split), body: split < 0 ? '' : text.slice(split + 4) });
      } else if (err) {
        settled = true;
        reject(err);
      }
    };
    const timer = setTimeout(() => {
      sock.destroy();
      finish(new Error(`no HTTP response to POST ${path} within ${REQUEST_TIMEOUT_MS} ms`));
    }, REQUEST_TIMEOUT_MS);
    sock.on('data', (d) => {
      received = Buffer.concat([received, d]);
      const text = received.toString('latin1');
      const split = text.indexOf('\r\n\r\n');
      if (split >= 0) {
        const len = /\r\ncontent-length:\s*(\d+)/i.exec(text.slice(0, split));
        if (len && received.length >= split + 4 + Number(len[1])) {
          clearTimeout(timer);
          sock.destroy();
          finish();
        }
      }
    });
    sock.on('error', (e) => {
      clearTimeout(timer);
      finish(new Error(`POST ${path}: ${e.message} before any response`));
    });
    sock.on('close', () => {
      clearTimeout(timer);
      finish(new Error(`POST ${path}: connection closed before any response`));
    });
    sock.on('connect', async () => {
      const head = [`POST ${path} HTTP/1.1`, `Host: ${u.host}`, 'Connection: close', `Content-Length: ${body.length}`];
      for (const [k, v] of Object.entries(headers)) head.push(`${k}: ${v}`);
      sock.write(`${head.join('\r\n')}\r\n\r\n`);
      await sleep(200); // a server that checks Content-Length first may already have answered
      const piece = 1 << 20;
      for (let off = 0; off < body.length && received.length === 0 && !sock.destroyed; off += piece) {
        if (!sock.write(body.subarray(off, off + piece))) {
          await new Promise((r) => {
            sock.once('drain', r);
            sock.once('close', r);
          });
        }
      }
    });
  });
}

/** Parses Prometheus text exposition: {samples: [{name, labels, value}], types: Map, names: Set}. */
export function parsePrometheus(text) {
  const samples = [];
  const types = new Map();
  for (const raw of text.split('\n')) {
    const line = raw.trim();
    if (!line) continue;
    if (line.startsWith('#')) {
      const m = /^#\s+TYPE\s+(\S+)\s+(\S+)/.exec(line);
      if (m) types.set(m[1], m[2]);
      continue;
    }
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+-?\d+)?$/.exec(line);
    assert.ok(m, `/metrics: line is not valid Prometheus text format: ${JSON.stringify(raw)}`);
    const labels = {};
    for (const l of (m[2] ?? '').matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g)) labels[l[1]] = l[2];
    const v = m[3];
    const value = v === '+Inf' ? Infinity : v === '-Inf' ? -Infinity : Number(v);
    assert.ok(!Number.isNaN(value) || v === 'NaN', `/metrics: bad sample value in ${JSON.stringify(raw)}`);
    samples.push({ name: m[1], labels, value });
  }
  return { samples, types, names: new Set(samples.map((s) => s.name)) };
}

const DERIVED_SUFFIX = /(_total|_bucket|_sum|_count|_created|_seconds|_info)$/;

// Finds one gauge: an exact preferred name, else the spill: metric whose name matches every pattern.
// Sums over label sets (e.g. one series per GPU). Throws listing the spill: metrics when none fits.
export function findGauge(metrics, { preferred = [], patterns, what }) {
  let name = preferred.find((n) => metrics.names.has(n));
  if (!name) {
    const candidates = [...metrics.names].filter((n) => n.startsWith('spill:') && !DERIVED_SUFFIX.test(n) && patterns.every((p) => p.test(n)));
    candidates.sort((a, b) => a.length - b.length);
    name = candidates[0];
  }
  assert.ok(
    name,
    `/metrics: no ${what} gauge (looked for ${preferred.join(', ')} or a spill: metric matching ${patterns.join(' and ')}); ` +
      `spill: metrics present: ${[...metrics.names].filter((n) => n.startsWith('spill:')).join(', ') || '(none)'}`,
  );
  const value = metrics.samples.filter((s) => s.name === name).reduce((a, s) => a + s.value, 0);
  return { name, value };
}

export const kvUsage = (m) =>
  findGauge(m, { preferred: ['spill:kv_cache_usage_perc', 'spill:gpu_cache_usage_perc', 'spill:kv_cache_usage'], patterns: [/kv|cache/i, /usage|perc|util/i], what: 'KV cache usage' });
export const requestsRunning = (m) =>
  findGauge(m, { preferred: ['spill:num_requests_running', 'spill:requests_running'], patterns: [/running/i], what: 'running requests' });
export const requestsWaiting = (m) =>
  findGauge(m, { preferred: ['spill:num_requests_waiting', 'spill:requests_waiting'], patterns: [/waiting|queued/i], what: 'waiting requests' });

// ---------------------------------------------------------------------------------------------
// Assertions on the official error shapes.

/** OpenAI: HTTP status and {"error": {"message", "type", "param", "code"}}. Returns the error object. */
export function assertOpenAIError(r, status, what) {
  const body = r.text ?? '';
  assert.equal(r.status, status, `${what}: expected HTTP ${status}, got ${r.status}: ${body.slice(0, 400)}`);
  assert.match(r.headers.get('content-type') ?? '', /application\/json/, `${what}: error content-type must be application/json`);
  const e = r.json?.error;
  assert.ok(e && typeof e === 'object', `${what}: body must be OpenAI-shaped {"error": {"message","type","param","code"}}, got ${body.slice(0, 400)}`);
  assert.equal(typeof e.message, 'string', `${what}: error.message must be a string: ${body.slice(0, 400)}`);
  assert.ok(e.message.length > 0, `${what}: error.message must not be empty`);
  assert.equal(typeof e.type, 'string', `${what}: error.type must be a string: ${body.slice(0, 400)}`);
  assert.ok('param' in e, `${what}: error.param must be present (a string or null): ${body.slice(0, 400)}`);
  assert.ok(e.param === null || typeof e.param === 'string', `${what}: error.param must be a string or null: ${body.slice(0, 400)}`);
  assert.ok('code' in e, `${what}: error.code must be present (a string or null): ${body.slice(0, 400)}`);
  assert.ok(e.code === null || typeof e.code === 'string' || typeof e.code === 'number', `${what}: error.code must be a string or null: ${body.slice(0, 400)}`);
  return e;
}

/** The error names the offending field, in error.param or in the message. */
export function assertNamesField(e, field, what) {
  assert.ok(
    e.param === field || e.message.includes(field),
    `${what}: the error should name the field "${field}" (in error.param or error.message), got param=${JSON.stringify(e.param)} message=${JSON.stringify(e.message)}`,
  );
}

/** Anthropic: HTTP status and {"type": "error", "error": {"type", "message"}}. Returns the error object. */
export function assertAnthropicError(r, status, type, what) {
  const body = r.text ?? '';
  assert.equal(r.status, status, `${what}: expected HTTP ${status}, got ${r.status}: ${body.slice(0, 400)}`);
  assert.equal(r.json?.type, 'error', `${what}: body must be Anthropic-shaped {"type":"error","error":{"type","message"}}, got ${body.slice(0, 400)}`);
  const e = r.json.error;
  assert.ok(e && typeof e === 'object', `${what}: "error" must be an object: ${body.slice(0, 400)}`);
  assert.equal(typeof e.message, 'string', `${what}: error.message must be a string: ${body.slice(0, 400)}`);
  assert.ok(e.message.length > 0, `${what}: error.message must not be empty`);
  if (type) assert.equal(e.type, type, `${what}: error.type: ${body.slice(0, 400)}`);
  else assert.equal(typeof e.type, 'string', `${what}: error.type must be a string: ${body.slice(0, 400)}`);
  return e;
}

// ---------------------------------------------------------------------------------------------
// Response shapes.

export function assertInt(v, what, { min = -Infinity, max = Infinity } = {}) {
  assert.ok(Number.isInteger(v), `${what} must be an integer, got ${JSON.stringify(v)}`);
  assert.ok(v >= min && v <= max, `${what} must be in [${min}, ${max}], got ${v}`);
}

/** OpenAI usage object, including prompt_tokens_details.cached_tokens. */
export function assertOpenAIUsage(usage, what, { maxCompletion } = {}) {
  assert.ok(usage && typeof usage === 'object', `${what}: usage must be present, got ${JSON.stringify(usage)}`);
  assertInt(usage.prompt_tokens, `${what}: usage.prompt_tokens`, { min: 1 });
  assertInt(usage.completion_tokens, `${what}: usage.completion_tokens`, { min: 0, max: maxCompletion ?? Infinity });
  assert.equal(usage.total_tokens, usage.prompt_tokens + usage.completion_tokens, `${what}: usage.total_tokens must be prompt_tokens + completion_tokens: ${JSON.stringify(usage)}`);
  assert.ok(usage.prompt_tokens_details && typeof usage.prompt_tokens_details === 'object', `${what}: usage.prompt_tokens_details must be present: ${JSON.stringify(usage)}`);
  assertInt(usage.prompt_tokens_details.cached_tokens, `${what}: usage.prompt_tokens_details.cached_tokens`, { min: 0, max: usage.prompt_tokens });
}

// Concatenated text of OpenAI stream chunks (chat deltas or completion text) for choice index.
export function openaiStreamText(chunks, index = 0) {
  let text = '';
  for (const c of chunks) {
    for (const ch of c.choices ?? []) {
      if (ch.index !== index) continue;
      text += ch.delta?.content ?? ch.text ?? '';
    }
  }
  return text;
}

/**
 * From a greedy completion text, picks a short stop string whose first occurrence is well inside the
 * text (not at 0), so a request with that stop must return exactly text.slice(0, index).
 * Returns null when the text is too short to pick one.
 */
export function pickStopString(text) {
  for (const len of [3, 2, 4, 1]) {
    for (let k = Math.max(1, Math.floor(text.length / 3)); k + len <= text.length; k++) {
      const s = text.slice(k, k + len);
      if (s.trim().length === 0) continue;
      if (text.indexOf(s) === k) return { stop: s, index: k };
    }
  }
  return null;
}

// Python-looking text of several hundred tokens, unique per nonce from its first token on.
export function longCodePrefix(nLines, nonce) {
  const lines = [`# session ${nonce}: helpers for a small inventory service`];
  for (let i = 0; i < nLines; i++) {
    lines.push(`def item_${i}_${nonce % 997}(store, key_${i}, default=${i}):`);
    lines.push(`    """Return entry ${i} of the store, or ${i * 7 % 13} when it is missing."""`);
    lines.push(`    return store.get(key_${i}, default) + ${(i * 31) % 101}`);
  }
  return `${lines.join('\n')}\n`;
}

export function median(xs) {
  const s = [...xs].sort((a, b) => a - b);
  const n = s.length;
  return n % 2 ? s[(n - 1) / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
}

/**
 * Whether the model's chat template puts tool definitions into the prompt: POST /tokenize with
 * messages, with and without tools (docs/API.md). False when /tokenize cannot say.
 */
export async function templateRendersTools(srv, messages, tools) {
  const count = async (extra) => {
    const r = await srv.post('/tokenize', { messages, add_generation_prompt: true, ...extra });
    return r.status === 200 && Array.isArray(r.json?.tokens) ? r.json.tokens.length : null;
  };
  const without = await count({});
  const withTools = await count({ tools });
  return without !== null && withTools !== null && withTools > without;
}

let nonceCounter = Math.floor(Math.random() * 1e6);
export const nonce = () => ++nonceCounter;

// Runs fn over items with at most `limit` in flight; results in item order.
export async function pool(items, limit, fn) {
  const results = new Array(items.length);
  let next = 0;
  const worker = async () => {
    while (next < items.length) {
      const i = next++;
      results[i] = await fn(items[i], i);
    }
  };
  await Promise.all(Array.from({ length: Math.min(limit, items.length) }, worker));
  return results;
}
