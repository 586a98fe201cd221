// Runs a real coding agent (installed from npm into tests/agents/node_modules, versions pinned in
// package.json) against `spill serve` on the bundled model, inside a network namespace that has
// only loopback, so nothing the agent tries to reach leaves the machine. Between the agent and
// spill sits the recording proxy (proxy.mjs), which also scripts the agent's first tool call
// (spill-tiny cannot write one into a 20K-token agent prompt) so that the agent runs its tool and
// sends spill a real tool-result turn.
//
// Environment: SPILL_BIN (set by tests/agents/run.sh), SPILL_TEST_MODEL (default: the bundled
// spill-tiny), SPILL_AGENT_VERBOSE=1 to print the agent's and the server's output.
import assert from 'node:assert/strict';
import { execFileSync, spawn, spawnSync } from 'node:child_process';
import crypto from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { createInterface } from 'node:readline';

import { isGeneration } from './proxy.mjs';

const HERE = path.dirname(new URL(import.meta.url).pathname);
const VERBOSE = process.env.SPILL_AGENT_VERBOSE === '1';
// Agents' system prompts and tool lists are 10K-30K tokens with spill-tiny's tokenizer; its own
// config says 2048, so the context is raised the way a user would (the tiny model's text past its
// training length is noise, which is fine: the test checks the protocol, not the prose).
export const CONTEXT = 32768;
export const AGENT_TIMEOUT_MS = 540_000;
// A server-side ceiling on each reply (spill serve --max-tokens), as an operator would set for a
// small model: some agents send no max_tokens and spill-tiny would fill the context.
export const REPLY_TOKENS = 48;

export const agentBin = (name) => path.join(HERE, 'node_modules', '.bin', name);

// Why a namespace cannot be made here, or null when it can.
let namespaceProblem;
export function namespaceUnavailable() {
  if (namespaceProblem !== undefined) return namespaceProblem;
  if (process.getuid?.() !== 0) return (namespaceProblem = 'needs root to create a network namespace (ip netns add)');
  const probe = `spill-probe-${process.pid}`;
  const add = spawnSync('ip', ['netns', 'add', probe], { encoding: 'utf8' });
  if (add.error) return (namespaceProblem = `cannot run ip (${add.error.code}); install iproute2`);
  if (add.status !== 0) return (namespaceProblem = `ip netns add failed: ${add.stderr.trim()}`);
  spawnSync('ip', ['netns', 'del', probe]);
  return (namespaceProblem = null);
}

function lines(stream, sink, onLine) {
  createInterface({ input: stream }).on('line', (line) => {
    sink.push(line);
    if (VERBOSE) process.stderr.write(`  | ${line}\n`);
    onLine?.(line);
  });
}

function waitForLine(proc, out, re, what, timeoutMs) {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`${what}: no line matching ${re} within ${timeoutMs} ms:\n${out.slice(-30).join('\n')}`)), timeoutMs);
    const check = (line) => {
      const m = re.exec(line);
      if (m) {
        clearTimeout(timer);
        resolve(m);
      }
    };
    out.forEach(check);
    proc.on('line', check);
    proc.on('exit', (code) => {
      clearTimeout(timer);
      reject(new Error(`${what} exited (${code}) before ${re}:\n${out.slice(-30).join('\n')}`));
    });
  });
}

function spawnLogged(cmd, args, opts) {
  const proc = spawn(cmd, args, { stdio: ['ignore', 'pipe', 'pipe'], ...opts });
  const out = [];
  const emitLine = (line) => proc.emit('line', line);
  lines(proc.stdout, out, emitLine);
  lines(proc.stderr, out, emitLine);
  proc.out = out;
  proc.done = new Promise((resolve) => proc.on('exit', (code, signal) => resolve({ code, signal })));
  return proc;
}

/**
 * One agent run. `agent(ctx)` returns {cmd, args, env, files?} given ctx = {baseUrl, workdir,
 * home, secretFile, model}; files are written (relative to home or absolute) before the agent starts.
 * Returns {records, agent: {code, signal, out}, secret, server: out lines}.
 */
export async function runAgent(name, agent, { serverArgs = [] } = {}) {
  const spill = process.env.SPILL_BIN;
  assert.ok(spill, 'SPILL_BIN is not set: run tests/agents/run.sh path/to/spill');
  const ns = `spill-${name}-${process.pid}`.slice(0, 40);
  const root = fs.mkdtempSync(path.join(os.tmpdir(), `spill-agent-${name}-`));
  const home = path.join(root, 'home');
  const workdir = path.join(root, 'work');
  fs.mkdirSync(home, { recursive: true });
  fs.mkdirSync(workdir, { recursive: true });
  const secret = `spill-agent-check-${crypto.randomBytes(6).toString('hex')}`;
  const secretFile = path.join(workdir, 'notes.txt');
  fs.writeFileSync(secretFile, `The check word is ${secret}.\n`);
  const logFile = path.join(root, 'proxy.jsonl');
  const procs = [];
  execFileSync('ip', ['netns', 'add', ns]);
  try {
    execFileSync('ip', ['-n', ns, 'link', 'set', 'lo', 'up']);
    const inNs = (cmd, args, opts) => {
      const p = spawnLogged('ip', ['netns', 'exec', ns, cmd, ...args], opts);
      procs.push(p);
      return p;
    };
    const model = process.env.SPILL_TEST_MODEL ? ['--model', process.env.SPILL_TEST_MODEL] : [];
    const server = inNs(spill, ['serve', ...model, '--port', '0', '--max-model-len', String(CONTEXT), '--kv-mem', '1G', '--max-tokens', String(REPLY_TOKENS), ...serverArgs]);
    const [, serverUrl] = await waitForLine(server, server.out, /^spill: listening on (http:\/\/\S+?)\/?$/, 'spill serve', 60_000);
    await waitForLine(server, server.out, /^spill: model .* ready/, 'spill serve', 180_000);
    const proxy = inNs(process.execPath, [path.join(HERE, 'proxy.mjs'), serverUrl, '0', logFile, '--script-tool-call', secretFile]);
    const [, baseUrl] = await waitForLine(proxy, proxy.out, /^proxy: listening on (\S+) /, 'proxy', 30_000);

    const spec = agent({ baseUrl, workdir, home, secretFile, model: 'spill-tiny' });
    for (const [file, text] of Object.entries(spec.files ?? {})) {
      const p = path.isAbsolute(file) ? file : path.join(home, file);
      fs.mkdirSync(path.dirname(p), { recursive: true });
      fs.writeFileSync(p, text);
    }
    const env = { PATH: `${path.dirname(process.execPath)}:${process.env.PATH}`, HOME: home, TERM: 'dumb', NO_COLOR: '1', CI: '1', ...spec.env };
    const run = inNs(spec.cmd, spec.args, { cwd: workdir, env });
    const timer = setTimeout(() => run.kill('SIGKILL'), AGENT_TIMEOUT_MS);
    const result = await run.done;
    clearTimeout(timer);
    const records = fs.existsSync(logFile) ? fs.readFileSync(logFile, 'utf8').trim().split('\n').filter(Boolean).map((l) => JSON.parse(l)) : [];
    records.sort((a, b) => a.index - b.index);
    return { records, agent: { ...result, out: run.out }, secret, server: server.out, ns };
  } finally {
    for (const p of procs.reverse()) {
      if (p.exitCode === null && p.signalCode === null) {
        p.kill('SIGTERM');
        const t = setTimeout(() => p.kill('SIGKILL'), 10_000);
        await p.done;
        clearTimeout(t);
      }
    }
    spawnSync('ip', ['netns', 'del', ns]);
    if (!VERBOSE) fs.rmSync(root, { recursive: true, force: true });
  }
}

const tail = (run) => `agent output:\n${run.agent.out.slice(-40).join('\n')}\nserver:\n${run.server.slice(-25).join('\n')}`;

// What every agent must show: its first generation request got a 200 stream from spill; its
// tool ran on the scripted call and the result went back to spill in a later request, which
// spill answered with a complete 200 reply; the agent then ended on its own with status 0.
// `endedCleanly(run)` says whether the agent's own ending was clean when that is more than exit
// status 0 (spill-tiny, past its training length, writes until the reply's token ceiling, which an
// agent may report as an error of the model rather than of the protocol).
export function checkRoundTrip(run, { api, endedCleanly = (r) => r.agent.code === 0 }) {
  const gen = run.records.filter((r) => r.method === 'POST' && isGeneration(r.path));
  assert.ok(gen.length >= 2, `expected at least two generation requests, got ${gen.length}: ${run.records.map((r) => `${r.method} ${r.path} ${r.status}`).join('; ')}\n${tail(run)}`);
  const first = gen[0];
  assert.equal(first.status, 200, `first request ${first.path}: ${first.status} ${first.text.slice(0, 500)}\n${tail(run)}`);
  if (first.body?.stream) assert.match(first.contentType ?? '', /text\/event-stream/, `first request streams: ${first.contentType}`);
  const ended = { anthropic: ['message_stop'], responses: ['response.completed', 'response.incomplete'], chat: ['[DONE]'] }[api];
  const complete = (r) => ended.some((e) => r.events.includes(e)) || (!r.body?.stream && r.status === 200);
  assert.ok(complete(first), `first reply ends with ${ended}: events ${r2s(first.events)}\n${tail(run)}`);

  const scripted = gen.find((r) => r.scripted);
  assert.ok(scripted, `no generation request offered a usable tool: ${gen.map((r) => JSON.stringify((r.body?.tools ?? []).map((t) => t.name ?? t.function?.name))).join(' ')}`);
  assert.equal(scripted.status, 200, `the request that got the scripted call was still answered by spill with 200: ${scripted.text.slice(0, 300)}`);
  const withResult = gen.filter((r) => r.index > scripted.index && JSON.stringify(r.body).includes(run.secret));
  assert.ok(withResult.length >= 1, `after the scripted call (${JSON.stringify(scripted.scripted)}), no request carried the file's check word: the tool result did not come back\n${tail(run)}`);
  const back = withResult[0];
  assert.equal(back.status, 200, `spill answered the tool-result turn with ${back.status}: ${back.text.slice(0, 500)}\n${tail(run)}`);
  assert.ok(complete(back), `the tool-result reply ends with ${ended}: events ${r2s(back.events)}`);
  assert.ok(endedCleanly(run), `the agent did not end cleanly: exit ${run.agent.code} (${run.agent.signal ?? 'no signal'})\n${tail(run)}`);
  return { first, scripted, back, gen };
}

const r2s = (events) => [...new Set(events)].join(',');
