// Continue CLI (@continuedev/cli, pinned) in headless mode (`cn -p`) against spill's OpenAI chat
// completions API, configured as a user would: a local config.yaml with an OpenAI provider whose
// apiBase is spill. Checks: the first chat request gets a 200 stream ending in [DONE]; a
// tool_calls / tool message round trip works (the read call is scripted by the proxy; the tool
// turn Continue then sends is spill's to answer).
import assert from 'node:assert/strict';
import path from 'node:path';
import { test } from 'node:test';

import { agentBin, checkRoundTrip, CONTEXT, namespaceUnavailable, REPLY_TOKENS, runAgent } from './helpers.mjs';

test('Continue CLI: first request streams, a tool_calls / tool turn round-trips', { timeout: 600_000 }, async (t) => {
  const why = namespaceUnavailable();
  if (why) return t.skip(`skipped: ${why}`);
  const run = await runAgent('continue', ({ baseUrl, secretFile, model, home }) => ({
    cmd: agentBin('cn'),
    args: ['-p', '--auto', '--config', path.join(home, 'spill.yaml'), `Read the file ${secretFile} and tell me the check word.`],
    env: { CONTINUE_GLOBAL_DIR: path.join(home, '.continue'), CONTINUE_TELEMETRY_ENABLED: '0' },
    files: {
      'spill.yaml': [
        'name: spill',
        'version: 0.0.1',
        'schema: v1',
        'models:',
        `  - name: ${model}`,
        '    provider: openai',
        `    model: ${model}`,
        `    apiBase: ${baseUrl}/v1`,
        '    apiKey: sk-spill-test',
        '    roles: [chat, edit, apply]',
        '    capabilities: [tool_use]',
        '    defaultCompletionOptions:',
        `      contextLength: ${CONTEXT}`,
        `      maxTokens: ${REPLY_TOKENS}`,
        '',
      ].join('\n'),
    },
  }));
  const { first, back } = checkRoundTrip(run, { api: 'chat' });
  assert.match(first.path, /^\/v1\/chat\/completions/, first.path);
  const toolTurns = back.body.messages.filter((m) => m.role === 'tool');
  assert.ok(toolTurns.some((m) => m.tool_call_id === 'call_scripted01'), `a tool message for the scripted call: ${JSON.stringify(toolTurns).slice(0, 400)}`);
});
