// The chat page (GET /) in headless Chromium, driven over the DevTools protocol (run by
// tests/t_80_server.sh with CHROME, K3_URL, OUT): loads the page with ?ask=..., waits until the
// streamed reply is complete (body[data-replies="1"]), reads the reply back from the DOM, checks it
// against the same request made directly, and saves a screenshot to $OUT/webpage.png.
// Node 20: WebSocket needs --experimental-websocket, so this script re-runs itself with it.
'use strict';
if (typeof WebSocket === 'undefined') {
  const r = require('child_process').spawnSync(process.execPath, ['--experimental-websocket', '--no-warnings', __filename],
    { stdio: 'inherit' });
  process.exit(r.status === null ? 1 : r.status);
}
const { spawn } = require('child_process');
const fs = require('fs');
const os = require('os');
const path = require('path');

const chrome = process.env.CHROME, url = process.env.K3_URL, out = process.env.OUT, key = process.env.K3_KEY || '';
const profile = fs.mkdtempSync(path.join(os.tmpdir(), 'k3-chromium-'));
const proc = spawn(chrome, ['--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking',
  '--no-first-run', '--user-data-dir=' + profile, '--remote-debugging-port=0', 'about:blank'],
  { stdio: ['ignore', 'ignore', 'pipe'] });
let done = false;
function finish(code, msg) {
  if (done) return;
  done = true;
  if (msg) console.log(msg);
  proc.kill('SIGKILL');
  try { fs.rmSync(profile, { recursive: true, force: true }); } catch (e) { /* */ }
  process.exit(code);
}
setTimeout(() => finish(1, 'FAIL: chromium page test timed out'), 90000);

let errbuf = '';
proc.stderr.on('data', async (d) => {
  errbuf += d.toString();
  const m = errbuf.match(/DevTools listening on (ws:\/\/\S+)/);
  if (!m || proc.wsFound) return;
  proc.wsFound = true;
  try { await drive(m[1]); } catch (e) { finish(1, 'FAIL: ' + (e.stack || e)); }
});
proc.on('exit', (c) => finish(1, 'FAIL: chromium exited (' + c + '): ' + errbuf.slice(-500)));

async function drive(browserWs) {
  // a page target: ask the browser for its list over HTTP
  const port = new URL(browserWs).port;
  const list = await (await fetch(`http://127.0.0.1:${port}/json/list`)).json();
  const page = list.find((t) => t.type === 'page');
  const ws = new WebSocket(page.webSocketDebuggerUrl);
  await new Promise((res, rej) => { ws.onopen = res; ws.onerror = rej; });
  let id = 0;
  const pending = new Map();
  ws.onmessage = (ev) => {
    const msg = JSON.parse(ev.data);
    if (msg.id && pending.has(msg.id)) { pending.get(msg.id)(msg); pending.delete(msg.id); }
  };
  const send = (method, params = {}) => new Promise((res) => {
    const i = ++id;
    pending.set(i, res);
    ws.send(JSON.stringify({ id: i, method, params }));
  });
  const evaluate = async (expr) => {
    const r = await send('Runtime.evaluate', { expression: expr, returnByValue: true, awaitPromise: true });
    if (r.result.exceptionDetails) throw new Error(JSON.stringify(r.result.exceptionDetails));
    return r.result.result.value;
  };
  await send('Page.enable');
  await send('Runtime.enable');
  await send('Emulation.setDeviceMetricsOverride', { width: 900, height: 700, deviceScaleFactor: 1, mobile: false });
  const ask = 'Hello from Chromium';
  await send('Page.navigate', { url: `${url}/?ask=${encodeURIComponent(ask)}&max=12&thinking=0&key=${encodeURIComponent(key)}` });
  let replies = null;
  for (let i = 0; i < 600 && replies !== '1'; i++) {
    await new Promise((r) => setTimeout(r, 100));
    replies = await evaluate("document.body ? document.body.getAttribute('data-replies') : null").catch(() => null);
    const err = await evaluate("Array.from(document.querySelectorAll('.err')).map(e => e.textContent).join(' ')").catch(() => '');
    if (err) throw new Error('the page shows an error: ' + err);
  }
  if (replies !== '1') throw new Error('no complete reply on the page');
  const shown = await evaluate("document.querySelector('.answer').textContent");
  const status = await evaluate("document.getElementById('status').textContent");
  // the same request, directly
  const r = await fetch(url + '/v1/chat/completions', { method: 'POST', headers: { 'Content-Type': 'application/json', Authorization: 'Bearer ' + key },
    body: JSON.stringify({ model: 'k3', messages: [{ role: 'user', content: ask }], max_tokens: 12, thinking: false }) });
  const j = await r.json();
  const want = j.choices[0].message.content || '';
  if (shown !== want) throw new Error(`page shows ${JSON.stringify(shown)}, the API says ${JSON.stringify(want)}`);
  const shot = await send('Page.captureScreenshot', { format: 'png' });
  fs.writeFileSync(path.join(out, 'webpage.png'), Buffer.from(shot.result.data, 'base64'));
  console.log(`chromium: streamed reply read back from the page (${shown.length} chars, ${status}); ` +
              `screenshot ${path.join(out, 'webpage.png')}`);
  ws.close();
  finish(0);
}
