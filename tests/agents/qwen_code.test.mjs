// Qwen Code (@qwen-code/qwen-code, pinned) in non-interactive mode against spill's OpenAI chat
// completions API (OPENAI_BASE_URL, as its docs say for OpenAI-compatible servers). Checks: the
// first POST /v1/chat/completions gets a 200 stream ending in [DONE]; a tool_calls / tool message
// round trip works (the read_file call is scripted by the proxy; the tool turn Qwen Code then
// sends is spill's to answer).
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { agentBin, checkRoundTrip, CONTEXT, namespaceUnavailable, runAgent } from './helpers.mjs';

test('Qwen Code: first request streams, a tool_calls / tool turn round-trips', { timeout: 600_000 }, async (t) => {
  const why = namespaceUnavailable();
  if (why) return t.skip(`skipped: ${why}`);
  const run = await runAgent('qwen', ({ baseUrl, secretFile, model }) => ({
    cmd: agentBin('qwen'),
    args: ['--yolo', '--model', model, `Read the file ${secretFile} and tell me the check word.`],
    env: { OPENAI_BASE_URL: `${baseUrl}/v1`, OPENAI_API_KEY: 'sk-spill-test', OPENAI_MODEL: model },
    files: {
      '.qwen/settings.json': JSON.stringify({
        security: { auth: { selectedType: 'openai' } },
        // Qwen Code gives up on a request after 120 s by default and retries it; a CPU prefill of
        // its 16K-token prompt takes longer, so the request timeout is raised as a user would.
        model: { name: model, sessionTokenLimit: CONTEXT, generationConfig: { timeout: 600_000 } },
        // Only the tool the test uses, so the CPU prefill of its prompt stays short.
        tools: { core: ['read_file'] },
        privacy: { usageStatisticsEnabled: false },
        telemetry: { enabled: false },
        general: { disableAutoUpdate: true, disableUpdateNag: true },
      }),
    },
  }));
  const { first, back } = checkRoundTrip(run, { api: 'chat' });
  assert.match(first.path, /^\/v1\/chat\/completions/, first.path);
  const toolTurns = back.body.messages.filter((m) => m.role === 'tool');
  assert.ok(toolTurns.some((m) => m.tool_call_id === 'call_scripted01'), `a tool message for the scripted call: ${JSON.stringify(toolTurns).slice(0, 400)}`);
});
