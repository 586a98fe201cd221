// A recording HTTP proxy, what a user debugging an agent would put between it and the server:
// every request (method, path, headers, JSON body) and its response (status, content type, the
// first bytes and the SSE event names) is kept in memory and, with a log file, appended as JSON lines.
// Responses are streamed through untouched, so the agent sees exactly what spill sent.
//
// As a program: node proxy.mjs TARGET_URL LISTEN_PORT LOG.jsonl
import fs from 'node:fs';
import http from 'node:http';

export function startProxy(target, { port = 0, logFile } = {}) {
  const records = [];
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
      const rec = { t: Date.now(), method: req.method, path: req.url, headers: req.headers, body, status: null, contentType: null, events: [], head: '' };
      records.push(rec);
      const url = new URL(req.url, target);
      const headers = { ...req.headers, host: url.host };
      const up = http.request(url, { method: req.method, headers }, (upRes) => {
        rec.status = upRes.statusCode;
        rec.contentType = upRes.headers['content-type'] ?? null;
        res.writeHead(upRes.statusCode, upRes.headers);
        let text = '';
        upRes.on('data', (c) => {
          res.write(c);
          if (text.length < 1 << 20) text += c.toString('utf8');
        });
        upRes.on('end', () => {
          res.end();
          rec.head = text.slice(0, 4000);
          rec.body_text = text.length < 1 << 20 ? text : null;
          for (const m of text.matchAll(/^event: (\S+)$/gm)) rec.events.push(m[1]);
          if (!rec.events.length) for (const m of text.matchAll(/^data: (.*)$/gm)) rec.events.push(m[1] === '[DONE]' ? '[DONE]' : 'data');
          rec.done = true;
          if (logFile) fs.appendFileSync(logFile, JSON.stringify(rec) + '\n');
        });
      });
      up.on('error', (e) => {
        rec.status = 502;
        rec.error = String(e);
        res.writeHead(502, { 'content-type': 'text/plain' });
        res.end(`proxy: ${e}`);
        if (logFile) fs.appendFileSync(logFile, JSON.stringify(rec) + '\n');
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

if (process.argv[1] && import.meta.url.endsWith(process.argv[1].split('/').pop())) {
  const [target, port, logFile] = process.argv.slice(2);
  if (!target) {
    console.error('usage: node proxy.mjs TARGET_URL [LISTEN_PORT] [LOG.jsonl]');
    process.exit(2);
  }
  const p = await startProxy(target, { port: Number(port ?? 0), logFile });
  console.log(`proxy: listening on ${p.url} -> ${target}`);
}
