// The MCP door as the official TypeScript SDK's client sees it (tests/api/mcp.rs runs this):
//   node mcp_client.mjs SCENARIO URL KEY
// plain: a plain call of `task`. abort: a call the client gives up on once its provider call is in
// flight (its AbortSignal fires: the SDK sends notifications/cancelled). long: a call of a 3-minute
// task with the SDK's default 60 s timeout, reset on every progress notification
// (`resetTimeoutOnProgress`). Prints one JSON object of facts, exits non-zero on a failed check.
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';

const [scenario, url, key] = process.argv.slice(2);
const check = (cond, what) => {
  if (!cond) {
    console.error('ASSERTION FAILED: ' + JSON.stringify(what));
    process.exit(1);
  }
};

const transport = new StreamableHTTPClientTransport(new URL(url), {
  requestInit: { headers: { Authorization: `Bearer ${key}` } },
});
const client = new Client({ name: 'subagentd-test', version: '1.0.0' });
await client.connect(transport);
const { tools } = await client.listTools();
check(tools.some((t) => t.name === 'task'), tools.map((t) => t.name));
let facts;
if (scenario === 'plain') {
  const r = await client.callTool({
    name: 'task',
    arguments: { subagent_type: 'general', description: 'from typescript', prompt: 'hi [mock:reply=hello from typescript]' },
  });
  check(!r.isError, r);
  const text = r.content.filter((c) => c.type === 'text').map((c) => c.text).join('');
  facts = { text, status: r.structuredContent.status, task_id: r.structuredContent.task_id };
} else if (scenario === 'abort') {
  const ac = new AbortController();
  const call = client.callTool(
    { name: 'task', arguments: { subagent_type: 'general', description: 'given up on', prompt: 'slow [mock:delay_ms=30000]' } },
    undefined,
    { signal: ac.signal },
  );
  // Given up on once its provider call is in flight (as the service's own task list and event
  // log tell), not after a guess: the test then finds that call stopped.
  const base = url.replace(/\/mcp$/, '');
  const get = async (path) => {
    const r = await fetch(base + path, { headers: { Authorization: `Bearer ${key}` } });
    if (!r.ok) check(false, `GET ${path}: ${r.status} ${await r.text()}`);
    return r.json();
  };
  // Settled whichever way it goes, while this waits: a rejection now is the check's below.
  const settled = call.then(() => false, () => true);
  const deadline = Date.now() + 30000;
  for (;;) {
    const { tasks } = await get('/tasks?limit=20');
    const mine = tasks.find((t) => t.description === 'given up on');
    if (mine && (await get(`/tasks/${mine.id}/events`)).events.some((e) => e.kind === 'llm_call_started')) break;
    check(Date.now() < deadline, 'the call started no provider call');
    await new Promise((r) => setTimeout(r, 50));
  }
  ac.abort('the user moved on');
  const aborted = await settled;
  check(aborted, 'the aborted call resolved');
  // The SDK sends its notifications/cancelled without waiting for it: let it go out before the
  // session ends.
  await new Promise((r) => setTimeout(r, 1000));
  facts = { aborted };
} else if (scenario === 'long') {
  const start = Date.now();
  const at = [];
  const r = await client.callTool(
    { name: 'task', arguments: { subagent_type: 'general', description: 'three minutes', prompt: 'slow [mock:delay_ms=180000] [mock:reply=worth the wait]' } },
    undefined,
    { onprogress: (p) => at.push({ ms: Date.now() - start, progress: p.progress }), resetTimeoutOnProgress: true },
  );
  const end = Date.now() - start;
  check(!r.isError, r);
  const text = r.content.filter((c) => c.type === 'text').map((c) => c.text).join('');
  const times = [0, ...at.map((p) => p.ms), end];
  const gaps = times.slice(1).map((t, i) => t - times[i]);
  const values = at.map((p) => p.progress);
  facts = {
    text, status: r.structuredContent.status, ms: end, notifications: at.length, max_gap_ms: Math.max(...gaps),
    growing: values.every((v, i) => i === 0 || v > values[i - 1]),
  };
} else {
  check(false, `no scenario ${scenario}`);
}
await transport.terminateSession();
await client.close();
console.log(JSON.stringify(facts));
