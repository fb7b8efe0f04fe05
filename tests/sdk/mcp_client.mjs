// The MCP door as the official TypeScript SDK's client sees it (tests/api/mcp.rs runs this):
//   node mcp_client.mjs URL KEY
// A plain call of `task`; prints one JSON object of facts, exits non-zero on a failed check.
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';

const [url, key] = process.argv.slice(2);
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
const r = await client.callTool({
  name: 'task',
  arguments: { subagent_type: 'general', description: 'from typescript', prompt: 'hi [mock:reply=hello from typescript]' },
});
check(!r.isError, r);
const text = r.content.filter((c) => c.type === 'text').map((c) => c.text).join('');
await transport.terminateSession();
await client.close();
console.log(JSON.stringify({ text, status: r.structuredContent.status, task_id: r.structuredContent.task_id }));
