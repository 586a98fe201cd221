// Codex CLI (@openai/codex, pinned; a native binary inside the npm package) in `codex exec`
// against spill's Responses API (wire_api = "responses", the only one it speaks), configured as a
// user would in ~/.codex/config.toml. Checks: the first POST /v1/responses gets a 200 stream that
// ends with response.completed; a function_call / function_call_output round trip works (the shell
// call is scripted by the proxy; the function_call_output Codex then sends is spill's to answer).
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { agentBin, checkRoundTrip, CONTEXT, namespaceUnavailable, runAgent } from './helpers.mjs';

test('Codex CLI: first response streams, a function_call / function_call_output turn round-trips', { timeout: 600_000 }, async (t) => {
  const why = namespaceUnavailable();
  if (why) return t.skip(`skipped: ${why}`);
  const run = await runAgent('codex', ({ baseUrl, secretFile, model }) => ({
    cmd: agentBin('codex'),
    args: ['exec', '--skip-git-repo-check', '--dangerously-bypass-approvals-and-sandbox', '--color', 'never', `Print the contents of ${secretFile}.`],
    env: { SPILL_API_KEY: "sk-spill-test" },
    files: {
      '.codex/config.toml': [
        `model = "${model}"`,
        'model_provider = "spill"',
        `model_context_window = ${CONTEXT}`,
        'check_for_update_on_startup = false',
        '[model_providers.spill]',
        'name = "spill"',
        `base_url = "${baseUrl}/v1"`,
        'wire_api = "responses"',
        'env_key = "SPILL_API_KEY"',
        'stream_max_retries = 0',
        'request_max_retries = 0',
        '',
      ].join('\n'),
    },
  }));
  // Codex ends with status 0, or reports the reply cut at the token ceiling (status incomplete,
  // from spill --max-tokens), which shows it read spill's stream to its last event.
  const endedCleanly = (r) => r.agent.code === 0 || r.agent.out.some((l) => /Incomplete response returned, reason: max_output_tokens/.test(l));
  const { first, back } = checkRoundTrip(run, { api: 'responses', endedCleanly });
  assert.match(first.path, /^\/v1\/responses/, first.path);
  const outputs = (back.body.input ?? []).filter((i) => i.type === 'function_call_output');
  assert.ok(outputs.some((i) => i.call_id === 'call_scripted01'), `a function_call_output for the scripted call: ${JSON.stringify(outputs).slice(0, 400)}`);
});
