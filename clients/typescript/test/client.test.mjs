// The TypeScript client (its built dist/) against the real service (tests/api/clients.rs starts
// it with the mock provider and runs `node --test`): every method; a dropped event stream resumed
// without gaps or duplicates; a create retried after a dropped connection making one task; a 429
// waited out; problems mapped to their errors; a signed webhook verified and a tampered one
// refused; no field the client's types do not know.
//
// Environment: SUBAGENTD_URL, SUBAGENTD_API_KEY (a tenant's key), SUBAGENTD_ADMIN_TOKEN.
import assert from "node:assert/strict";
import http from "node:http";
import net from "node:net";
import { test } from "node:test";

import {
  APIConnectionError, AuthenticationError, Client, ConflictError, MODEL_FIELDS, NotFoundError, RateLimitError,
  ValidationError, approve, deny, output, webhooks,
} from "../dist/index.js";

const URL_ = process.env.SUBAGENTD_URL;
const KEY = process.env.SUBAGENTD_API_KEY;
const ADMIN = process.env.SUBAGENTD_ADMIN_TOKEN;
const MODEL = "mock/m";
const unique = (w) => `${w}-${Math.random().toString(16).slice(2, 10)}`;
const client = new Client({ baseUrl: URL_, apiKey: KEY });
const admin = new Client({ baseUrl: URL_, apiKey: ADMIN });

/** Every field the API sent is one the client's types know (openapi.yaml documents it). */
function known(model, obj) {
  const fields = new Set(MODEL_FIELDS[model]);
  const unknown = Object.keys(obj).filter((k) => !fields.has(k));
  assert.deepEqual(unknown, [], `${model} has fields the client does not know`);
}

test("run, create, get, wait, list, messages and calls", async () => {
  const tag = unique("ts");
  const t = await client.tasks.run({ prompt: "Say hello [mock:reply=hello ts]", subagent_type: "research", model: MODEL, metadata: { suite: tag } });
  assert.equal(t.status, "completed");
  assert.equal(t.summary, "hello ts");
  known("Task", t);
  assert.equal((await client.tasks.get(t.id)).status, "completed");
  const bg = await client.tasks.create({ prompt: "Later [mock:delay_ms=300] [mock:reply=done]", model: MODEL, metadata: { suite: tag } });
  assert.ok(["queued", "running"].includes(bg.status));
  assert.equal((await client.tasks.wait(bg.id, 30)).summary, "done");
  const slow = await client.tasks.create({ prompt: "Slow [mock:delay_ms=3000]", model: MODEL });
  assert.ok(["queued", "running"].includes((await client.tasks.wait(slow.id, 0.2)).status));
  const ids = [];
  for await (const x of client.tasks.list({ metadata: { suite: tag }, limit: 1 })) ids.push(x.id);
  assert.deepEqual(new Set(ids), new Set([t.id, bg.id]));
  const msgs = await client.tasks.messages(t.id);
  assert.deepEqual(msgs.slice(0, 2).map((m) => m.message.role), ["system", "user"]);
  const calls = await client.tasks.calls(t.id);
  assert.equal(calls[0].outcome, "ok");
  assert.equal(calls[0].try, 1);
  msgs.forEach((m) => known("Message", m));
  calls.forEach((c) => known("Call", c));
});

test("cancel and cancelMany", async () => {
  const t = await client.tasks.create({ prompt: "Long [mock:delay_ms=20000]", model: MODEL });
  await client.tasks.cancel(t.id);
  assert.equal((await client.tasks.wait(t.id, 15)).status, "cancelled");
  const tag = unique("bulk");
  const made = new Set();
  for (let i = 0; i < 2; i++) made.add((await client.tasks.create({ prompt: "p [mock:delay_ms=20000]", model: MODEL, metadata: { b: tag } })).id);
  const r = await client.tasks.cancelMany({ metadata: { b: tag } });
  assert.deepEqual(new Set([...r.cancelled, ...r.cancel_requested]), made);
});

test("a pause answered with output, deny and approve", async () => {
  const tools = [
    { name: "deploy", description: "Deploys", parameters: { type: "object" }, policy: "propose", endpoint: "http://127.0.0.1:9/never" },
    { name: "ask_user", description: "Asks the user", parameters: { type: "object" }, policy: "auto" },
  ];
  const t = await client.tasks.run({ prompt: "Ask, then deploy [mock:tool_turns=1] [mock:tool=ask_user,deploy] [mock:reply=all done]", model: MODEL, approval: "propose", tools });
  assert.equal(t.status, "requires_action");
  const by = Object.fromEntries(t.pending_actions.map((a) => [a.name, a]));
  await client.tasks.answer(t.id, [output(by.ask_user.id, { answer: 42 }), deny(by.deploy.id, "not today")]);
  const done = await client.tasks.wait(t.id, 30);
  assert.equal(done.summary, "all done");
  const t2 = await client.tasks.run({ prompt: "Deploy [mock:tool_turns=1] [mock:tool=deploy] [mock:reply=ok]", model: MODEL, approval: "all", tools: tools.slice(0, 1) });
  await client.tasks.answer(t2.id, [approve(t2.pending_actions[0].id)]);
  assert.equal((await client.tasks.wait(t2.id, 30)).status, "completed");
  await assert.rejects(client.tasks.answer(t2.id, [deny(t2.pending_actions[0].id)]), (e) => e instanceof ConflictError && e.status === 409 && !!e.code);
});

/** A TCP proxy to the service that cuts the first connection after `cutAfter` bytes of its
 * answer, or drops the first `dropFirst` answers whole. */
function cutter({ cutAfter, dropFirst = 0 }) {
  const up = new URL(URL_);
  let n = 0;
  const server = net.createServer((c) => {
    const mine = ++n;
    const u = net.connect(Number(up.port), up.hostname);
    c.on("data", (b) => u.write(b));
    let sent = 0;
    u.on("data", (b) => {
      if (mine <= dropFirst) return c.destroy();
      if (cutAfter !== undefined && mine === 1 && sent + b.length > cutAfter) {
        c.write(b.subarray(0, cutAfter - sent));
        c.destroy();
        return u.destroy();
      }
      sent += b.length;
      c.write(b);
    });
    u.on("end", () => c.end());
    c.on("close", () => u.destroy());
    u.on("error", () => c.destroy());
    c.on("error", () => u.destroy());
  });
  return new Promise((resolve) => server.listen(0, "127.0.0.1", () => resolve({
    url: `http://127.0.0.1:${server.address().port}`, count: () => n, close: () => server.close(),
  })));
}

test("a dropped event stream is resumed without gaps or duplicates", async () => {
  const t = await client.tasks.create({ prompt: "Steps [mock:tool_turns=4] [mock:delay_ms=250] [mock:stream_ms=20] [mock:reply=a b c d e]", model: MODEL, max_turns: 6 });
  const p = await cutter({ cutAfter: 700 });
  const c = new Client({ baseUrl: p.url, apiKey: KEY });
  const events = [];
  for await (const e of c.tasks.events(t.id)) events.push(e);
  p.close();
  assert.ok(p.count() >= 2, "cut, and resumed");
  const seqs = events.filter((e) => e.kind !== "output_delta").map((e) => e.seq);
  assert.deepEqual(seqs, seqs.map((_, i) => i + 1));
  assert.equal(events.at(-1).kind, "finished");
  events.filter((e) => e.kind !== "output_delta").forEach((e) => known("Event", e));
});

test("a create retried after a dropped connection makes one task", async () => {
  const p = await cutter({ dropFirst: 1 });
  const tag = unique("once");
  const c = new Client({ baseUrl: p.url, apiKey: KEY });
  const t = await c.tasks.create({ prompt: "Once [mock:reply=once]", model: MODEL, metadata: { tag } });
  p.close();
  assert.equal(p.count(), 2, "the first answer was lost; the create was sent again");
  const made = [];
  for await (const x of client.tasks.list({ metadata: { tag } })) made.push(x.id);
  assert.deepEqual(made, [t.id]);
});

test("a rate limit is waited out", async () => {
  const tenant = unique("rl");
  const key = (await admin.admin.keys.create(tenant)).key;
  await admin.admin.tenants.put(tenant, { requests_per_second: 1, request_burst: 1 });
  await new Promise((r) => setTimeout(r, 3000));
  const c = new Client({ baseUrl: URL_, apiKey: key });
  const started = Date.now();
  for (let i = 0; i < 3; i++) assert.ok((await c.agents.list()).length);
  assert.ok(Date.now() - started >= 1000, "it waited as the service asked");
  const noRetry = new Client({ baseUrl: URL_, apiKey: key, maxRetries: 0 });
  await assert.rejects(async () => { for (let i = 0; i < 5; i++) await noRetry.agents.list(); },
    (e) => e instanceof RateLimitError && e.status === 429 && e.retryAfter !== undefined);
});

test("problems become their errors with their fields", async () => {
  await assert.rejects(client.tasks.create({ prompt: "", model: MODEL }),
    (e) => e instanceof ValidationError && e.status === 422 && e.code === "validation_failed" && e.errors[0].field === "prompt" && !!e.detail);
  await assert.rejects(client.tasks.get(crypto.randomUUID()), (e) => e instanceof NotFoundError && e.code === "not_found");
  await assert.rejects(new Client({ baseUrl: URL_, apiKey: "sk_wrong" }).agents.list(), (e) => e instanceof AuthenticationError);
  const key = unique("k");
  await client.tasks.create({ prompt: "a", model: MODEL, idempotency_key: key });
  await assert.rejects(client.tasks.create({ prompt: "b", model: MODEL, idempotency_key: key }), (e) => e instanceof ConflictError);
  await assert.rejects(new Client({ baseUrl: "http://127.0.0.1:9", apiKey: KEY, maxRetries: 0 }).agents.list(), (e) => e instanceof APIConnectionError);
});

test("a signed webhook is verified and a tampered one refused", async () => {
  const got = [];
  const server = http.createServer((req, res) => {
    const chunks = [];
    req.on("data", (c) => chunks.push(c));
    req.on("end", () => { got.push({ headers: req.headers, body: Buffer.concat(chunks) }); res.end(); });
  });
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  const { secret } = await client.tools.rotateSigningSecret();
  try {
    const t = await client.tasks.run({ prompt: "Hook [mock:reply=hooked]", model: MODEL, webhook_url: `http://127.0.0.1:${server.address().port}/hook` });
    const until = Date.now() + 20000;
    while (!got.length && Date.now() < until) await new Promise((r) => setTimeout(r, 100));
    const { headers, body } = got[0];
    await webhooks.verify(secret, headers, body);
    const event = await webhooks.constructEvent(secret, headers, body);
    assert.equal(event.event, "task.finished");
    assert.equal(event.task.id, t.id);
    const tampered = Buffer.from(body.toString().replace("hooked", "hacked"));
    await assert.rejects(webhooks.verify(secret, headers, tampered), webhooks.WebhookVerificationError);
    await assert.rejects(webhooks.verify("another secret", headers, body), webhooks.WebhookVerificationError);
  } finally {
    server.close();
  }
});

test("agents, tools, tool sources, schedules, usage and admin", async () => {
  const name = unique("triage");
  const a = await client.agents.put(name, { system_prompt: "You triage.", description: "Sorts tickets", max_turns: 3 });
  assert.equal(a.source, "api");
  const b = await client.agents.putMarkdown(`${name}-md`, `---\nname: ${name}-md\ndescription: From a file\n---\nYou read files.\n`);
  assert.equal(b.description, "From a file");
  assert.ok((await client.agents.list()).some((x) => x.name === name));
  assert.equal((await client.agents.get(name)).system_prompt, "You triage.");
  await client.agents.delete(`${name}-md`);
  await assert.rejects(client.agents.get(`${name}-md`), NotFoundError);
  const tool = await client.tools.put("lookup-ts", { description: "Looks up", parameters: { type: "object" }, policy: "auto", endpoint: "http://127.0.0.1:9/x" });
  assert.equal(tool.name, "lookup-ts");
  assert.ok((await client.tools.list()).some((x) => x.name === "lookup-ts"));
  assert.equal((await client.tools.get("lookup-ts")).description, "Looks up");
  await client.tools.delete("lookup-ts");
  assert.ok(Array.isArray(await client.toolSources.list()));
  const sname = unique("nightly");
  const s = await client.schedules.put(sname, { cron: "0 3 * * *", timezone: "Europe/Paris", task: { prompt: "Nightly digest", model: MODEL } });
  assert.ok(s.next_run_at);
  known("Schedule", s);
  assert.equal((await client.schedules.pause(sname)).paused, true);
  assert.equal((await client.schedules.resume(sname)).paused, false);
  assert.ok((await client.schedules.list()).some((x) => x.name === sname));
  assert.equal((await client.schedules.get(sname)).cron, "0 3 * * *");
  await client.schedules.delete(sname);
  // A tar.gz made here: one 512-byte header, the file's bytes padded to 512, two empty blocks.
  const { gzipSync } = await import("node:zlib");
  const data = Buffer.from("pub fn retry_policy() {}\n");
  const header = Buffer.alloc(512);
  header.write("src/lib.rs", 0);
  header.write("0000644\0", 100);
  header.write("0000000\0", 108);
  header.write("0000000\0", 116);
  header.write(data.length.toString(8).padStart(11, "0") + "\0", 124);
  header.write("00000000000\0", 136);
  header.write("        ", 148);
  header.write("0", 156);
  header.write("ustar\0" + "00", 257);
  let sum = 0;
  for (const b of header) sum += b;
  header.write(sum.toString(8).padStart(6, "0") + "\0 ", 148);
  const body = Buffer.concat([header, data, Buffer.alloc(512 - data.length), Buffer.alloc(1024)]);
  const wname = unique("code").toLowerCase();
  const w = await client.workspaces.put(wname, new Uint8Array(gzipSync(body)));
  assert.equal(w.files, 1);
  assert.deepEqual(w.dropped, []);
  known("Workspace", w);
  assert.equal((await client.workspaces.get(wname)).content_hash, w.content_hash);
  assert.ok((await client.workspaces.list()).some((x) => x.name === wname));
  await client.workspaces.delete(wname);
  await assert.rejects(client.workspaces.get(wname), NotFoundError);
  // A named environment: defined, read, listed and removed (its image on a registry that is not
  // there: the build, where the sandbox runs, waits on it, `building`).
  const env = await client.environments.put(wname, {
    image: "127.0.0.1:9/none/base:1",
    setup: "echo ready",
    network: { allow: ["registry.npmjs.org"], in_runs: false },
  });
  assert.deepEqual([env.name, env.status, env.network_allow], [wname, "building", ["registry.npmjs.org"]]);
  known("Environment", env);
  assert.equal((await client.environments.get(wname)).definition_hash, env.definition_hash);
  assert.ok((await client.environments.list()).some((x) => x.name === wname));
  await assert.rejects(
    client.environments.put(wname, { image: "127.0.0.1:9/none/base:1", network: { allow: ["*"] } }),
    ValidationError,
  );
  await client.environments.delete(wname);
  await assert.rejects(client.environments.get(wname), NotFoundError);
  const sec = await client.secrets.put(wname, { value: "tok", host: "git.example.com" });
  assert.equal(sec.host, "git.example.com");
  assert.ok(!JSON.stringify(await client.secrets.list()).includes("tok\""));
  await client.secrets.delete(wname);
  const report = await client.usage.get({ group_by: ["model"] });
  assert.ok(report.rows.some((r) => r.model === MODEL));
  assert.match(await client.usage.csv({ group_by: "model" }), /model/);
  const tenant = unique("t");
  const k = await admin.admin.keys.create(tenant, "ci");
  assert.ok(k.key.startsWith("sk_"));
  known("NewKey", k);
  assert.ok((await admin.admin.keys.list(tenant)).some((x) => x.tenant === tenant));
  const limits = await admin.admin.tenants.put(tenant, { usd_per_day: 5, max_running: 2 });
  assert.equal(limits.max_running, 2);
  const view = await admin.admin.tenants.get(tenant);
  assert.equal(view.limits.max_running, 2);
  assert.ok((await admin.admin.tenants.list()).includes(tenant));
  await admin.admin.keys.revoke(k.id);
  await assert.rejects(new Client({ baseUrl: URL_, apiKey: k.key }).agents.list(), AuthenticationError);
});

test("configuration comes from the environment", async () => {
  const c = new Client();
  assert.equal(c.baseUrl, URL_.replace(/\/+$/, ""));
  assert.equal(c.apiKey, KEY);
  assert.ok((await c.agents.list()).length);
});
