// `spill bench` against a real `spill serve` on the bundled model, small sizes. What the bench
// reports must agree with what the server counted: its own before/after scrape of /metrics and
// this test's scrape (requests, prompt, generated and cached tokens), and the prompts it built must
// have exactly the tokens it says (the chat template adds the same few tokens at every length).
// Then `--compare` and `spill seats --bench` read the result.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, before, test } from 'node:test';
import { promisify } from 'node:util';

import { spillBinary, startServer, unlessTrained } from './helpers.mjs';

// spill bench sizes prompts exactly with one-letter words, one token each with a trained BPE.
const SKIP = unlessTrained('spill bench counts one-letter words as one token each, and the random model\'s byte-level tokenizer (no merges) makes " a" two');

const run = promisify(execFile);
const LENGTHS = [64, 200, 333];
const CONCURRENCY = [1, 2];

let srv;
let dir;
let before_;
let after_;
let result;
let records;
let benchStdout;

function counter(metrics, name) {
  return metrics.samples.filter((s) => s.name === name).reduce((a, s) => a + s.value, 0);
}

before(async () => {
  if (SKIP) return;
  srv = await startServer();
  dir = fs.mkdtempSync(path.join(os.tmpdir(), 'spill-bench-'));
  before_ = await srv.metrics();
  const args = [
    'bench', srv.url, '--scenario', 'tiny-agent,tiny-long-context,tiny-prefix-cache', '--concurrency', CONCURRENCY.join(','),
    '--turns', '2', '--lengths', LENGTHS.join(','), '--prefix-tokens', '300', '--users', '2', '--out', path.join(dir, 'a'),
    '--label', 'run-a', '--seed', '5',
  ];
  const r = await run(spillBinary(), args, { timeout: 600_000, maxBuffer: 64 << 20 });
  benchStdout = r.stdout;
  after_ = await srv.metrics();
  result = JSON.parse(fs.readFileSync(path.join(dir, 'a', 'result.json'), 'utf8'));
  records = fs.readFileSync(path.join(dir, 'a', 'requests.jsonl'), 'utf8').trim().split('\n').map((l) => JSON.parse(l));
});
after(async () => {
  await srv?.stop();
  if (dir) fs.rmSync(dir, { recursive: true, force: true });
});

test('every request succeeded and the report covers every scenario', { skip: SKIP }, () => {
  assert.ok(records.length > 0);
  for (const r of records) assert.equal(r.error, '', `request failed: ${JSON.stringify(r).slice(0, 300)}`);
  assert.deepEqual(result.scenarios.map((s) => s.name), ['tiny-agent', 'tiny-long-context', 'tiny-prefix-cache']);
  const agent = result.scenarios[0];
  assert.deepEqual(agent.groups.map((g) => g.x), CONCURRENCY);
  // Closed loop: c agents x 1 session x 2 turns per level.
  for (const g of agent.groups) assert.equal(g.summary.completed, g.x * 2);
  assert.deepEqual(result.scenarios[1].groups.map((g) => g.x), LENGTHS);
  assert.match(benchStdout, /\| streams \| requests \| tok\/s per stream, median \| p5 \|/);
  const html = fs.readFileSync(path.join(dir, 'a', 'report.html'), 'utf8');
  assert.equal((html.match(/<svg /g) ?? []).length, 3, 'three charts: per-stream speed, TTFT vs length, TPOT vs depth');
});

test('the client totals equal the server /metrics counters (this test scraped them too)', { skip: SKIP }, () => {
  const ok = records.filter((r) => r.error === '');
  const sum = (k) => ok.reduce((a, r) => a + r[k], 0);
  const delta = (name) => counter(after_, name) - counter(before_, name);
  const expected = {
    requests: delta('spill:request_success_total'),
    prompt_tokens: delta('spill:prompt_tokens_total'),
    generation_tokens: delta('spill:generation_tokens_total'),
    cached_prompt_tokens: delta('spill:prompt_tokens_cached_total'),
  };
  assert.equal(ok.length, expected.requests, 'requests');
  assert.equal(sum('prompt_tokens'), expected.prompt_tokens, 'prompt tokens');
  assert.equal(sum('output_tokens'), expected.generation_tokens, 'generated tokens');
  assert.equal(sum('cached_tokens'), expected.cached_prompt_tokens, 'cached tokens');
  assert.ok(expected.cached_prompt_tokens > 0, 'the prefix-cache scenario must hit the cache');
  // The bench's own scrape, before its first request and after its last, saw the same.
  assert.deepEqual(
    {
      requests: result.server_metrics.delta.requests,
      prompt_tokens: result.server_metrics.delta.prompt_tokens,
      generation_tokens: result.server_metrics.delta.generation_tokens,
      cached_prompt_tokens: result.server_metrics.delta.cached_prompt_tokens,
    },
    expected,
  );
  assert.equal(result.client_totals.requests, expected.requests);
  assert.equal(result.client_totals.prompt_tokens, expected.prompt_tokens);
  assert.equal(result.client_totals.output_tokens, expected.generation_tokens);
  assert.equal(result.client_totals.cached_tokens, expected.cached_prompt_tokens);
});

test('prompts have exact token counts and outputs their fixed lengths', { skip: SKIP }, () => {
  const long = records.filter((r) => r.scenario === 'tiny-long-context');
  assert.deepEqual(long.map((r) => r.content_tokens), LENGTHS);
  // One user message each: the template's overhead is the same at every length only if the
  // content had exactly content_tokens tokens.
  const overhead = new Set(long.map((r) => r.prompt_tokens - r.content_tokens));
  assert.equal(overhead.size, 1, `template overhead differs between lengths: ${[...overhead]}`);
  assert.ok([...overhead][0] > 0 && [...overhead][0] < 32);
  for (const r of records) {
    assert.equal(r.output_tokens, r.max_tokens, `ignore_eos: ${r.scenario} ${r.group} turn ${r.turn}`);
    assert.ok(r.usage_reported);
  }
});

test('statistics in result.json follow from requests.jsonl', { skip: SKIP }, () => {
  // Recompute one group by vLLM's definitions: TPOT = (latency - TTFT) / (tokens - 1).
  const g = result.scenarios[0].groups[1];
  const mine = records.filter((r) => r.scenario === 'tiny-agent' && r.group === g.group);
  const tpot = mine.map((r) => (r.latency_s - r.ttft_s) / (r.output_tokens - 1)).sort((a, b) => a - b);
  const pct = (xs, p) => {
    const rank = (p / 100) * (xs.length - 1);
    const lo = Math.floor(rank);
    const hi = Math.min(lo + 1, xs.length - 1);
    return xs[lo] + (xs[hi] - xs[lo]) * (rank - lo);
  };
  assert.ok(Math.abs(g.summary.tpot_s.median - pct(tpot, 50)) <= 1e-12 * Math.max(1, pct(tpot, 50)));
  const speeds = tpot.map((t) => 1 / t).sort((a, b) => a - b);
  assert.ok(Math.abs(g.summary.stream_tok_s.p5 - pct(speeds, 5)) <= 1e-9 * pct(speeds, 5));
});

test('--compare puts two results side by side', { skip: SKIP }, async () => {
  const b = path.join(dir, 'b');
  fs.mkdirSync(b);
  const copy = { ...result, label: 'run-b' };
  fs.writeFileSync(path.join(b, 'result.json'), JSON.stringify(copy));
  const out = path.join(dir, 'cmp');
  const r = await run(spillBinary(), ['bench', '--compare', path.join(dir, 'a'), path.join(b, 'result.json'), '--out', out], { timeout: 60_000 });
  assert.match(r.stdout, /\| run-a \| 1 \|/);
  assert.match(r.stdout, /\| run-b \| 1 \|/);
  assert.ok(fs.readFileSync(path.join(out, 'compare.html'), 'utf8').includes('<svg '));
});

test('spill seats reads the capacity from the bench result', { skip: SKIP }, async () => {
  // A 1 tok/s SLO without margin: every measured level holds, so the capacity is the largest.
  const r = await run(spillBinary(), ['seats', '--bench', path.join(dir, 'a'), '--slo', '1', '--margin', '0', '--json'], { timeout: 60_000 });
  const seats = JSON.parse(r.stdout);
  assert.equal(seats.capacity, Math.max(...CONCURRENCY));
  // An SLO above every measured p5 leaves no capacity: a clear error, not a zero-seat answer.
  const top = Math.max(...result.scenarios[0].groups.map((g) => g.summary.stream_tok_s.p5));
  await assert.rejects(run(spillBinary(), ['seats', '--bench', path.join(dir, 'a'), '--slo', String(top * 10)], { timeout: 60_000 }), (e) => {
    assert.match(e.stderr, /no capacity/);
    return true;
  });
});

test('bad input is refused with a clear message', { skip: SKIP }, async () => {
  await assert.rejects(run(spillBinary(), ['bench', srv.url, '--scenario', 'agent-5k'], { timeout: 60_000 }), (e) => {
    assert.match(e.stderr, /unknown scenario 'agent-5k'/);
    return true;
  });
  await assert.rejects(run(spillBinary(), ['bench', 'http://127.0.0.1:1', '--scenario', 'tiny-agent'], { timeout: 60_000 }), (e) => {
    assert.match(e.stderr, /cannot reach/);
    return true;
  });
});
