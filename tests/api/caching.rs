//! Provider prompt caching, end to end: Anthropic cache breakpoints against a fake server that
//! caches the way the provider documents it, the billed input of a cached research run against
//! an uncached one, and an OpenAI-compatible request prefix that stays byte-stable from turn to
//! turn (the condition of OpenAI's automatic prefix caching).

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use axum::extract::State;
use axum::routing::post;
use axum::{Json, Router};
use rust_decimal::Decimal;
use serde_json::value::RawValue;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use subagentd::config::FileConfig;
use subagentd::llm::Providers;

use crate::fakes::*;
use crate::helpers::*;

/// What the fake billed one request: tokens of the tools and system prompt, then plain input,
/// cache reads and cache writes.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Billed {
    prefix: u64,
    plain: u64,
    read: u64,
    write: u64,
}

impl Billed {
    fn total(&self) -> u64 {
        self.plain + self.read + self.write
    }
}

/// A fake Anthropic Messages API with a prompt cache as the provider documents it. The prompt
/// is a sequence of blocks, in order: the tools, the system prompt, each message's content
/// blocks (text given as a string is one text block). A block marked `cache_control` is a
/// breakpoint. The prefix up to a breakpoint, if at least 1,024 tokens long, is written to the
/// cache; a request whose prefix up to some block — at a breakpoint, or up to 20 blocks before
/// one — was written before reads that much from the cache. Marks themselves are not content.
/// A token is four characters of the block's JSON.
///
/// It answers as a research sub-agent would: a `lookup` call on each of the first four turns,
/// its findings on the fifth.
#[derive(Clone, Default)]
struct CachingAnthropic {
    cache: Arc<Mutex<HashSet<[u8; 32]>>>,
    billed: Arc<Mutex<Vec<Billed>>>,
    marks: Arc<Mutex<Vec<usize>>>,
}

/// The prompt's blocks, without their marks: (canonical JSON, marked, part of tools/system).
fn blocks(body: &Value) -> Vec<(String, bool, bool)> {
    let mut out = vec![];
    let mut push = |v: &Value, role: Option<&Value>, head: bool| {
        let mut v = v.clone();
        let marked = v.as_object_mut().and_then(|o| o.remove("cache_control")).is_some();
        let v = match role {
            Some(r) => json!({"role": r, "block": v}),
            None => v,
        };
        out.push((v.to_string(), marked, head));
    };
    for t in body["tools"].as_array().into_iter().flatten() {
        push(t, None, true);
    }
    match &body["system"] {
        Value::String(s) => push(&json!({"type": "text", "text": s}), None, true),
        Value::Array(b) => b.iter().for_each(|x| push(x, None, true)),
        _ => {}
    }
    for m in body["messages"].as_array().into_iter().flatten() {
        match &m["content"] {
            Value::String(s) => push(&json!({"type": "text", "text": s}), Some(&m["role"]), false),
            Value::Array(b) => b.iter().for_each(|x| push(x, Some(&m["role"]), false)),
            _ => {}
        }
    }
    out
}

impl CachingAnthropic {
    fn bill(&self, body: &Value) -> Billed {
        let b = blocks(body);
        let (mut cum, mut hashes, mut total, mut prefix) = (vec![], vec![], 0u64, 0u64);
        let mut h = Sha256::new();
        for (s, _, head) in &b {
            let tokens = (s.len() as u64).div_ceil(4);
            total += tokens;
            if *head {
                prefix += tokens;
            }
            cum.push(total);
            h.update(s.as_bytes());
            h.update([0]);
            hashes.push(<[u8; 32]>::from(h.clone().finalize()));
        }
        let breakpoints: Vec<usize> = (0..b.len()).filter(|&i| b[i].1 && cum[i] >= 1024).collect();
        let mut cache = self.cache.lock().unwrap();
        let read = breakpoints
            .iter()
            .flat_map(|&bp| bp.saturating_sub(20)..=bp)
            .filter(|&j| cache.contains(&hashes[j]))
            .map(|j| cum[j])
            .max()
            .unwrap_or(0);
        let write = breakpoints.last().map_or(0, |&bp| cum[bp].saturating_sub(read));
        for &bp in &breakpoints {
            cache.insert(hashes[bp]);
        }
        Billed { prefix, plain: total - read - write, read, write }
    }
}

async fn answer(State(f): State<CachingAnthropic>, body: axum::body::Bytes) -> Json<Value> {
    let body: Value = serde_json::from_slice(&body).unwrap();
    f.marks.lock().unwrap().push(body.to_string().matches("cache_control").count());
    let billed = f.bill(&body);
    f.billed.lock().unwrap().push(billed);
    let turn = body["messages"].as_array().unwrap().iter().filter(|m| m["role"] == "assistant").count() + 1;
    let usage = json!({"input_tokens": billed.plain, "cache_read_input_tokens": billed.read,
                       "cache_creation_input_tokens": billed.write, "output_tokens": 30});
    Json(if turn < 5 {
        json!({"id": format!("msg_{turn}"), "type": "message", "role": "assistant", "model": body["model"],
               "content": [{"type": "tool_use", "id": format!("toolu_{turn}"), "name": "lookup",
                            "input": {"q": format!("part {turn}")}}],
               "stop_reason": "tool_use", "usage": usage})
    } else {
        json!({"id": "msg_5", "type": "message", "role": "assistant", "model": body["model"],
               "content": [{"type": "text", "text": "The lease is renewed every 10 s.\nSources: lookup (parts 1-4)"}],
               "stop_reason": "end_turn", "usage": usage})
    })
}

async fn caching_anthropic() -> (CachingAnthropic, String) {
    let f = CachingAnthropic::default();
    let app = Router::new().route("/v1/messages", post(answer)).with_state(f.clone());
    let base = serve_router(app).await;
    (f, base)
}

/// A `lookup` tool endpoint whose every result is about 500 tokens (2,000 characters).
async fn lookup_server() -> String {
    let app = Router::new().route(
        "/lookup",
        post(|Json(b): Json<Value>| async move {
            let q = b["arguments"]["q"].as_str().unwrap_or("?").to_string();
            let mut text = format!("Notes for {q}: ");
            while text.len() < 2_000 {
                text.push_str("the worker renews its lease every ten seconds and the rescuer reclaims it. ");
            }
            text.truncate(2_000);
            Json(json!({"content": text}))
        }),
    );
    let base = serve_router(app).await;
    base
}

fn providers(toml_text: &str) -> Providers {
    let file: FileConfig = toml::from_str(toml_text).unwrap();
    Providers::from_config(&file, &|_| None).unwrap()
}

async fn finished(app: &TestApp, body: Value) -> Value {
    let r = app.post_json("/tasks?wait=true&timeout=60", body).await;
    assert_eq!(r.status(), 200, "task did not finish in time");
    r.json().await.unwrap()
}

/// A research task with a long parent context and one lookup tool with a long description:
/// with the research prompt, about 4,000 tokens of system prompt and tools.
fn research_task(model: &str, lookup: &str) -> Value {
    let mut context = String::from("Repository notes for the question below.\n");
    let mut i = 0;
    while context.len() < 13_100 {
        i += 1;
        context.push_str(&format!(
            "{i}. The jobs module claims queued tasks with SKIP LOCKED, renews each lease on a heartbeat, and \
             finishes a run in one fenced statement.\n"
        ));
    }
    let mut description = String::from("Look up a topic in the project's notes. ");
    while description.len() < 1_800 {
        description.push_str("Give a short query naming one module or mechanism; the notes answer in prose. ");
    }
    json!({"prompt": "How often does a worker renew its lease, and who takes over a lapsed one?",
           "model": model, "subagent_type": "research", "parent_context": context,
           "tools": [{"name": "lookup", "description": description, "policy": "auto",
                      "endpoint": format!("{lookup}/lookup"),
                      "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}}]})
}

type LedgerRow = (i64, i64, i64, i64, Option<Decimal>);

async fn ledger(app: &TestApp, id: &str) -> Vec<LedgerRow> {
    sqlx::query_as(
        "SELECT input_tokens, cached_tokens, cache_write_tokens, output_tokens, cost_usd FROM llm_calls
         WHERE task_id = $1::uuid ORDER BY id",
    )
    .bind(id)
    .fetch_all(&app.db.pool)
    .await
    .unwrap()
}

/// claude-sonnet-4-5's list prices per million tokens: input, cache read, cache write, output.
const SONNET: (i64, &str, &str, i64) = (3, "0.3", "3.75", 15);

/// The billed input cost of a ledger row (plain at the input rate, reads and writes at theirs).
fn input_cost(r: &LedgerRow) -> Decimal {
    let (input, read, write) = (Decimal::from(r.0), Decimal::from(r.1), Decimal::from(r.2));
    let (i, c, w) =
        (Decimal::from(SONNET.0), SONNET.1.parse::<Decimal>().unwrap(), SONNET.2.parse::<Decimal>().unwrap());
    ((input - read - write) * i + read * c + write * w) / Decimal::from(1_000_000)
}

#[tokio::test]
async fn a_five_turn_research_run_bills_at_least_60_percent_less_input_with_cache_breakpoints() {
    let (cached, cached_url) = caching_anthropic().await;
    let (plain, plain_url) = caching_anthropic().await;
    let lookup = lookup_server().await;
    let p = providers(&format!(
        r#"
        [providers.ant]
        kind = "anthropic"
        base_url = "{cached_url}"
        shipped_prices = true
        stream = false
        [providers.nocache]
        kind = "anthropic"
        base_url = "{plain_url}"
        shipped_prices = true
        stream = false
        prompt_caching = false
        "#
    ));
    let app = crate::servers::app_with(p, |_| {}).await;

    let with = finished(&app, research_task("ant/claude-sonnet-4-5", &lookup)).await;
    let without = finished(&app, research_task("nocache/claude-sonnet-4-5", &lookup)).await;
    for t in [&with, &without] {
        assert_eq!(t["status"], "completed", "{t}");
        assert_eq!(t["turns"], 5);
    }

    // The setting: about 4,000 tokens of system prompt and tools, about 500 per tool result.
    let billed_with = cached.billed.lock().unwrap().clone();
    let billed_without = plain.billed.lock().unwrap().clone();
    assert_eq!(billed_with.len(), 5);
    assert_eq!(billed_without.len(), 5);
    let head = billed_without[0].prefix;
    assert!((3_800..=4_300).contains(&head), "system prompt and tools: {head} tokens");
    let growth = billed_without[2].total() - billed_without[1].total();
    assert!((500..=600).contains(&growth), "a turn adds its tool call and a result of about 500 tokens: {growth}");

    // Without the switch: no mark is sent, nothing is read or written.
    assert!(plain.marks.lock().unwrap().iter().all(|&m| m == 0));
    assert!(billed_without.iter().all(|b| b.read == 0 && b.write == 0));
    // With it: at most four marks a request; from the second turn on, the whole previous
    // request is read from the cache, and only the new turn is written.
    assert!(cached.marks.lock().unwrap().iter().all(|&m| (1..=4).contains(&m)));
    assert_eq!(billed_with[0].read, 0);
    for w in billed_with.windows(2) {
        assert_eq!(w[1].read, w[0].total(), "turn reads the previous request whole: {billed_with:?}");
        assert_eq!(w[1].write, w[1].total() - w[0].total(), "{billed_with:?}");
    }

    // The ledger records what the provider billed, cache writes apart, and cost_usd is exact.
    let rows_with = ledger(&app, with["id"].as_str().unwrap()).await;
    let rows_without = ledger(&app, without["id"].as_str().unwrap()).await;
    for (row, b) in rows_with.iter().zip(&billed_with) {
        assert_eq!((row.0, row.1, row.2), (b.total() as i64, b.read as i64, b.write as i64));
        let out = Decimal::from(row.3 * SONNET.3) / Decimal::from(1_000_000);
        assert_eq!(row.4, Some(input_cost(row) + out), "cost_usd is the provider's bill");
    }
    let sum = |rows: &[LedgerRow], f: fn(&LedgerRow) -> i64| rows.iter().map(f).sum::<i64>();
    assert_eq!(with["usage"]["cache_write_tokens"], sum(&rows_with, |r| r.2));
    assert_eq!(with["usage"]["cached_tokens"], sum(&rows_with, |r| r.1));
    assert!(without["usage"].get("cache_write_tokens").is_none(), "{}", without["usage"]);
    let calls = app.get_json(&format!("/tasks/{}/calls", with["id"].as_str().unwrap())).await;
    assert_eq!(calls["calls"][0]["cache_write_tokens"], rows_with[0].2);
    let usage = app.get_json("/usage?group_by=model").await;
    let row = usage["rows"].as_array().unwrap().iter().find(|r| r["model"] == "ant/claude-sonnet-4-5").unwrap();
    assert_eq!(row["cache_write_tokens"], sum(&rows_with, |r| r.2), "the rollup counts cache writes: {row}");

    let cost_with: Decimal = rows_with.iter().map(input_cost).sum();
    let cost_without: Decimal = rows_without.iter().map(input_cost).sum();
    let saved = Decimal::ONE - cost_with / cost_without;
    println!(
        "prompt caching: billed input of a 5-turn research run ({head} tokens of system prompt and tools, \
         {growth} per turn): ${cost_without} without, ${cost_with} with: {}% lower",
        (saved * Decimal::from(100)).round_dp(1)
    );
    assert!(saved >= Decimal::new(60, 2), "caching saves {saved}");
    app.stop().await;
}

/// The messages of a request, each as the bytes sent, and the tools as sent.
#[derive(serde::Deserialize)]
struct Wire<'a> {
    #[serde(borrow)]
    messages: Vec<&'a RawValue>,
    #[serde(borrow)]
    tools: Option<&'a RawValue>,
    #[serde(default)]
    prompt_cache_key: Option<String>,
}

#[tokio::test]
async fn an_openai_compatible_prefix_stays_byte_stable_and_the_cache_key_follows_the_run() {
    let (oai, oai_url) = serve("/v1/chat/completions").await;
    let lookup = lookup_server().await;
    let p = providers(&format!(
        r#"
        [providers.local]
        kind = "openai"
        base_url = "{oai_url}/v1"
        [providers.keyed]
        kind = "openai"
        base_url = "{oai_url}/v1"
        prompt_caching = true
        "#
    ));
    let app = crate::servers::app_with(p, |_| {}).await;
    for (model, prompt) in [("local/m", "Lease?"), ("keyed/m", "Lease?"), ("keyed/m", "Rescue?")] {
        oai.push(Answer::json(openai_tool_call("call_1", "lookup", r#"{"q":"leases"}"#)));
        oai.push(Answer::json(openai_tool_call("call_2", "lookup", r#"{"q":"rescues"}"#)));
        oai.push(Answer::json(openai_text("Every 10 s; the rescuer.", 900, 20, 0)));
        let mut task = research_task(model, &lookup);
        task["prompt"] = json!(prompt);
        let t = finished(&app, task).await;
        assert_eq!(t["status"], "completed", "{t}");
    }
    let seen = oai.seen();
    assert_eq!(seen.len(), 9);
    let wires: Vec<Wire> = seen.iter().map(|s| serde_json::from_slice(&s.raw).unwrap()).collect();
    for run in wires.chunks(3) {
        for w in run.windows(2) {
            let (a, b) = (&w[0], &w[1]);
            assert_eq!(a.tools.map(RawValue::get), b.tools.map(RawValue::get), "the tools, byte for byte");
            assert!(b.messages.len() > a.messages.len());
            for (i, (x, y)) in a.messages.iter().zip(&b.messages).enumerate() {
                assert_eq!(x.get(), y.get(), "message {i} reads the same on the next turn");
            }
        }
    }
    // Off by default for a server that is not the official API; on, one key for every turn of
    // a run (its system prompt and task), another for a run with another task.
    assert!(wires[..3].iter().all(|w| w.prompt_cache_key.is_none()));
    let keys: Vec<&str> = wires[3..].iter().map(|w| w.prompt_cache_key.as_deref().unwrap()).collect();
    assert!(keys[..3].iter().all(|k| *k == keys[0]) && keys[3..].iter().all(|k| *k == keys[3]), "{keys:?}");
    assert_ne!(keys[0], keys[3], "two tasks, two keys");
    app.stop().await;
}
