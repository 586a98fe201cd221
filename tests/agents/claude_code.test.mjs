// Claude Code (@anthropic-ai/claude-code, pinned in package.json) in print mode against spill's
// Anthropic Messages API (ANTHROPIC_BASE_URL): its real traffic goes through the recording
// proxy. Checks what a user needs: the first POST /v1/messages?beta=true (its own default system
// prompt, ~8K tokens, with only the Read tool so the CPU prefill stays short; max_tokens 32000,
// adaptive thinking, beta headers) gets a 200 stream,
// and a tool_use / tool_result round trip works (the Read call is scripted by the proxy; the
// tool_result turn Claude Code then sends is spill's to answer).
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { agentBin, checkRoundTrip, CONTEXT, namespaceUnavailable, runAgent } from './helpers.mjs';

test('Claude Code: first request streams, a Read tool_use / tool_result turn round-trips', { timeout: 600_000 }, async (t) => {
  const why = namespaceUnavailable();
  if (why) return t.skip(`skipped: ${why}`);
  const run = await runAgent('claude', ({ baseUrl, secretFile }) => ({
    cmd: agentBin('claude'),
    args: ['-p', `Read the file ${secretFile} and tell me the check word.`, '--model', 'claude-sonnet-4-6', '--tools', 'Read', '--allowedTools', 'Read', '--output-format', 'json'],
    env: {
      ANTHROPIC_BASE_URL: baseUrl,
      ANTHROPIC_API_KEY: 'sk-ant-spill-test',
      CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC: '1',
      DISABLE_TELEMETRY: '1',
      DISABLE_AUTOUPDATER: '1',
    },
  }));
  // Claude Code's result: success, or its report that the reply hit the token ceiling
  // (stop_reason max_tokens from spill --max-tokens), which shows it parsed spill's stream to the end.
  const result = (r) => {
    const line = r.agent.out.filter((l) => l.startsWith('{')).at(-1);
    return line ? JSON.parse(line) : null;
  };
  const endedCleanly = (r) => {
    const out = result(r);
    return out?.type === 'result' && (out.is_error === false || out.api_error === 'max_output_tokens');
  };
  const { first, back } = checkRoundTrip(run, { api: 'anthropic', endedCleanly });
  assert.match(first.path, /^\/v1\/messages\?beta=true/, first.path);
  assert.ok(first.headers['anthropic-beta'], 'Claude Code sends beta headers');
  // 32000 plus a prompt of thousands of tokens is more than the 32K context: spill clamps it.
  assert.ok(first.body.max_tokens + 1000 > CONTEXT, `max_tokens ${first.body.max_tokens}`);
  const results = back.body.messages.flatMap((m) => (Array.isArray(m.content) ? m.content : [])).filter((b) => b.type === 'tool_result');
  assert.ok(results.some((b) => b.tool_use_id === 'toolu_scripted01'), `a tool_result for the scripted call: ${JSON.stringify(results).slice(0, 400)}`);
});
