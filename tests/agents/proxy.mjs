// A recording HTTP proxy, what a user debugging an agent would put between it and the server:
// every request (method, path, headers, JSON body) and its response (status, content type, the
// body up to 1 MiB, the SSE event names) is kept and appended to a JSON-lines log. Responses are
// streamed through untouched, so the agent sees exactly what spill sent.
//
// Test fixture, for the tool-call round trip (spill-tiny cannot write a sensible call into an
// agent's 20K-token prompt): with --script-tool-call FILE, the first generation request that
// offers tools is still sent to spill and its whole reply recorded, but the agent is answered
// with a scripted call of its own file-reading (or shell) tool on FILE, in the API's wire format.
// The agent then runs the tool and sends spill a real tool-result turn, which is forwarded as it is.
//
// As a program: node proxy.mjs TARGET_URL LISTEN_PORT LOG.jsonl [--script-tool-call FILE]
// prints "proxy: listening on URL" once it listens.
import fs from 'node:fs';
import http from 'node:http';

const GENERATION_PATHS = [/^\/v1\/messages(\?|$)/, /^\/v1\/chat\/completions/, /^\/v1\/responses(\?|$)/, /^\/chat\/completions/, /^\/responses(\?|$)/];
export const isGeneration = (path) => GENERATION_PATHS.some((re) => re.test(path));

// ---- the scripted tool call ----

// The tools of a request as [{name, schema}], whichever API shape.
function toolsOf(body) {
  return (body?.tools ?? [])
    .map((t) => {
      if (t.function) return { name: t.function.name, schema: t.function.parameters ?? {} };  // chat completions
      if (t.input_schema) return { name: t.name, schema: t.input_schema };  // Anthropic
      if (t.type === 'function') return { name: t.name, schema: t.parameters ?? {} };  // Responses
      return null;
    })
    .filter((t) => t && t.name);
}

// A call that makes the agent read `file`: its read tool if it has one, else its shell tool.
export function scriptedCall(body, file) {
  const tools = toolsOf(body);
  const props = (t) => t.schema?.properties ?? {};
  const pathProp = (t) => Object.keys(props(t)).find((k) => /path|file/i.test(k) && props(t)[k].type !== 'array');
  const read = tools.find((t) => /^(read|read_?file|view|readfile)$/i.test(t.name) && pathProp(t))
    ?? tools.find((t) => /read/i.test(t.name) && !/many|multiple|image|url|web|notebook/i.test(t.name) && pathProp(t));
  if (read) return { name: read.name, args: { [pathProp(read)]: file } };
  const shell = tools.find((t) => /^(bash|shell|exec_command|run_shell_command|run_terminal_command|terminal|exec)$/i.test(t.name))
    ?? tools.find((t) => /shell|bash|command|terminal/i.test(t.name));
  if (shell) {
    const p = props(shell);
    const key = Object.keys(p).find((k) => /^(command|cmd)$/.test(k)) ?? Object.keys(p)[0];
    const args = { [key]: p[key]?.type === 'array' ? ['cat', file] : `cat ${file}` };
    for (const r of shell.schema?.required ?? []) if (!(r in args) && p[r]?.type === 'string') args[r] = 'Read the test file';
    return { name: shell.name, args };
  }
  return null;
}

const sse = (event, data) => (event ? `event: ${event}\n` : '') + `data: ${typeof data === 'string' ? data : JSON.stringify(data)}\n\n`;

// The reply carrying the call, in the wire format of the request's API.
function scriptedReply(path, body, call) {
  const args = JSON.stringify(call.args);
  const model = body.model ?? 'scripted';
  const stream = body.stream === true;
  if (/messages/.test(path)) {
    const use = { type: 'tool_use', id: 'toolu_scripted01', name: call.name, input: call.args };
    const usage = { input_tokens: 1, output_tokens: 1 };
    if (!stream) return { type: 'application/json', text: JSON.stringify({ id: 'msg_scripted', type: 'message', role: 'assistant', model, content: [use], stop_reason: 'tool_use', stop_sequence: null, usage }) };
    return {
      type: 'text/event-stream',
      text:
        sse('message_start', { type: 'message_start', message: { id: 'msg_scripted', type: 'message', role: 'assistant', model, content: [], stop_reason: null, stop_sequence: null, usage } }) +
        sse('content_block_start', { type: 'content_block_start', index: 0, content_block: { ...use, input: {} } }) +
        sse('content_block_delta', { type: 'content_block_delta', index: 0, delta: { type: 'input_json_delta', partial_json: args } }) +
        sse('content_block_stop', { type: 'content_block_stop', index: 0 }) +
        sse('message_delta', { type: 'message_delta', delta: { stop_reason: 'tool_use', stop_sequence: null }, usage: { output_tokens: 1 } }) +
        sse('message_stop', { type: 'message_stop' }),
    };
  }
  if (/responses/.test(path)) {
    const item = { id: 'fc_scripted01', type: 'function_call', status: 'completed', call_id: 'call_scripted01', name: call.name, arguments: args };
    const response = (status, output) => ({ id: 'resp_scripted', object: 'response', created_at: Math.floor(Date.now() / 1000), status, model, output, usage: status === 'completed' ? { input_tokens: 1, input_tokens_details: { cached_tokens: 0 }, output_tokens: 1, output_tokens_details: { reasoning_tokens: 0 }, total_tokens: 2 } : null, error: null, incomplete_details: null, tools: body.tools ?? [], parallel_tool_calls: true, tool_choice: 'auto' });
    if (!stream) return { type: 'application/json', text: JSON.stringify(response('completed', [item])) };
    let n = 0;
    const ev = (type, fields) => sse(type, { type, sequence_number: n++, ...fields });
    return {
      type: 'text/event-stream',
      text:
        ev('response.created', { response: response('in_progress', []) }) +
        ev('response.in_progress', { response: response('in_progress', []) }) +
        ev('response.output_item.added', { output_index: 0, item: { ...item, status: 'in_progress', arguments: '' } }) +
        ev('response.function_call_arguments.delta', { item_id: item.id, output_index: 0, delta: args }) +
        ev('response.function_call_arguments.done', { item_id: item.id, output_index: 0, name: call.name, arguments: args }) +
        ev('response.output_item.done', { output_index: 0, item }) +
        ev('response.completed', { response: response('completed', [item]) }),
    };
  }
  // Chat completions.
  const head = { id: 'chatcmpl-scripted', object: 'chat.completion.chunk', created: Math.floor(Date.now() / 1000), model };
  const tc = { index: 0, id: 'call_scripted01', type: 'function', function: { name: call.name, arguments: args } };
  const usage = { prompt_tokens: 1, completion_tokens: 1, total_tokens: 2 };
  if (!stream)
    return { type: 'application/json', text: JSON.stringify({ ...head, object: 'chat.completion', choices: [{ index: 0, message: { role: 'assistant', content: null, tool_calls: [{ id: tc.id, type: tc.type, function: tc.function }] }, finish_reason: 'tool_calls', logprobs: null }], usage }) };
  return {
    type: 'text/event-stream',
    text:
      sse(null, { ...head, choices: [{ index: 0, delta: { role: 'assistant', content: null, tool_calls: [tc] }, finish_reason: null, logprobs: null }] }) +
      sse(null, { ...head, choices: [{ index: 0, delta: {}, finish_reason: 'tool_calls', logprobs: null }] }) +
      (body.stream_options?.include_usage ? sse(null, { ...head, choices: [], usage }) : '') +
      sse(null, '[DONE]'),
  };
}

// ---- the proxy ----

export function startProxy(target, { port = 0, logFile, scriptToolCallFile } = {}) {
  const records = [];
  let scripted = false;
  const server = http.createServer((req, res) => {
    const chunks = [];
    req.on('data', (c) => chunks.push(c));
    req.on('end', () => {
      const raw = Buffer.concat(chunks);
      let body = null;
      try {
        body = raw.length ? JSON.parse(raw.toString('utf8')) : null;
      } catch {
        body = raw.toString('utf8').slice(0, 2000);
      }
      const rec = { index: records.length, t: Date.now(), method: req.method, path: req.url, headers: req.headers, body, status: null, contentType: null, events: [], text: '' };
      records.push(rec);
      let call = null;
      if (scriptToolCallFile && !scripted && req.method === 'POST' && isGeneration(req.url) && toolsOf(body).length) {
        call = scriptedCall(body, scriptToolCallFile);
        if (call) {
          scripted = true;
          rec.scripted = call;
        }
      }
      const url = new URL(req.url, target);
      // No compression, so the log can be read (the agent is told the same by the headers it gets).
      const headers = { ...req.headers, host: url.host, 'accept-encoding': 'identity' };
      const finish = () => {
        for (const m of rec.text.matchAll(/^event: ?(\S+)$/gm)) rec.events.push(m[1]);
        if (!rec.events.length) for (const m of rec.text.matchAll(/^data: ?(.*)$/gm)) rec.events.push(m[1] === '[DONE]' ? '[DONE]' : 'data');
        if (logFile) fs.appendFileSync(logFile, JSON.stringify(rec) + '\n');
      };
      const up = http.request(url, { method: req.method, headers }, (upRes) => {
        rec.status = upRes.statusCode;
        rec.contentType = upRes.headers['content-type'] ?? null;
        if (!call) res.writeHead(upRes.statusCode, upRes.headers);
        upRes.on('data', (c) => {
          if (!call) res.write(c);
          if (rec.text.length < 1 << 24) rec.text += c.toString('utf8');
        });
        upRes.on('end', () => {
          finish();
          if (!call) return res.end();
          const reply = scriptedReply(req.url, body, call);
          rec.scriptedReply = reply.text;
          res.writeHead(200, { 'content-type': reply.type, 'cache-control': 'no-cache' });
          res.end(reply.text);
        });
      });
      up.on('error', (e) => {
        rec.status = 502;
        rec.error = String(e);
        finish();
        res.writeHead(502, { 'content-type': 'text/plain' });
        res.end(`proxy: ${e}`);
      });
      up.end(raw);
    });
  });
  return new Promise((resolve) => {
    server.listen(port, '127.0.0.1', () => {
      const url = `http://127.0.0.1:${server.address().port}`;
      resolve({ url, records, close: () => new Promise((r) => { server.closeAllConnections?.(); server.close(r); }) });
    });
  });
}

if (process.argv[1] && import.meta.url === new URL(`file://${fs.realpathSync(process.argv[1])}`).href) {
  const args = process.argv.slice(2);
  const scriptAt = args.indexOf('--script-tool-call');
  const scriptToolCallFile = scriptAt >= 0 ? args.splice(scriptAt, 2)[1] : undefined;
  const [target, port, logFile] = args;
  if (!target) {
    console.error('usage: node proxy.mjs TARGET_URL [LISTEN_PORT] [LOG.jsonl] [--script-tool-call FILE]');
    process.exit(2);
  }
  const p = await startProxy(target, { port: Number(port ?? 0), logFile, scriptToolCallFile });
  console.log(`proxy: listening on ${p.url} -> ${target}`);
}
