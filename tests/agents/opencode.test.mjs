// opencode (opencode-ai, pinned; a native binary in the npm package) in `opencode run` against
// spill's OpenAI chat completions API, configured as a user would: an OpenAI-compatible provider
// in opencode.json. Checks: the first chat request gets a 200 stream ending in [DONE]; a
// tool_calls / tool message round trip works (the read call is scripted by the proxy; the tool
// turn opencode then sends is spill's to answer).
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { agentBin, checkRoundTrip, CONTEXT, namespaceUnavailable, REPLY_TOKENS, runAgent } from './helpers.mjs';

test('opencode: first request streams, a tool_calls / tool turn round-trips', { timeout: 600_000 }, async (t) => {
  const why = namespaceUnavailable();
  if (why) return t.skip(`skipped: ${why}`);
  const run = await runAgent('opencode', ({ baseUrl, secretFile, model, workdir }) => ({
    cmd: agentBin('opencode'),
    args: ['run', '--model', `spill/${model}`, '--auto', `Read the file ${secretFile} and tell me the check word.`],
    env: { OPENCODE_DISABLE_MODELS_FETCH: '1', OPENCODE_DISABLE_AUTOUPDATE: '1', OPENCODE_DISABLE_LSP_DOWNLOAD: '1', OPENCODE_DISABLE_DEFAULT_PLUGINS: '1' },
    files: {
      [`${workdir}/opencode.json`]: JSON.stringify({
        $schema: 'https://opencode.ai/config.json',
        autoupdate: false,
        share: 'disabled',
        model: `spill/${model}`,
        small_model: `spill/${model}`,
        provider: {
          spill: {
            npm: '@ai-sdk/openai-compatible',
            name: 'spill',
            options: { baseURL: `${baseUrl}/v1`, apiKey: 'sk-spill-test' },
            models: { [model]: { name: model, tool_call: true, limit: { context: CONTEXT, output: REPLY_TOKENS } } },
          },
        },
      }),
    },
  }));
  const { first, back } = checkRoundTrip(run, { api: 'chat' });
  assert.match(first.path, /^\/v1\/chat\/completions/, first.path);
  const toolTurns = back.body.messages.filter((m) => m.role === 'tool');
  assert.ok(toolTurns.some((m) => m.tool_call_id === 'call_scripted01'), `a tool message for the scripted call: ${JSON.stringify(toolTurns).slice(0, 400)}`);
});
