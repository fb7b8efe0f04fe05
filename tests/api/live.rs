//! Live output: a streamed answer's text reaches the task's live event stream as `output_delta`
//! events — coalesced, in order, joining into the summary, never stored, with no `id:` — on
//! the replica that runs the task and on another one; a reconnect resumes the stored events.

use std::time::Duration;

use futures_util::StreamExt;
use serde_json::{json, Value};

use crate::fakes::*;
use crate::helpers::*;
use crate::servers::{app_with, providers};

/// An OpenAI-compatible stream of `pieces` of text, then the finish, the usage and `[DONE]`.
fn text_stream(pieces: &[String]) -> Vec<Value> {
    let mut out = vec![json!({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})];
    out.extend(pieces.iter().map(|p| json!({"choices": [{"index": 0, "delta": {"content": p}}]})));
    out.push(json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}));
    out.push(json!({"choices": [], "usage": {"prompt_tokens": 50, "completion_tokens": 400}}));
    out.push(json!("[DONE]"));
    out
}

fn words(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("w{i:03} ")).collect()
}

/// One Server-Sent Event as a client sees it.
#[derive(Debug, Clone)]
struct Sse {
    id: Option<String>,
    event: String,
    data: Value,
}

/// Read an SSE response until it ends (or `stop` says so), parsing its events.
async fn read_sse(r: reqwest::Response, mut stop: impl FnMut(&[Sse]) -> bool) -> Vec<Sse> {
    let mut body = r.bytes_stream();
    let (mut buf, mut out) = (String::new(), vec![]);
    while let Some(chunk) = body.next().await {
        buf.push_str(&String::from_utf8_lossy(&chunk.unwrap()));
        while let Some(end) = buf.find("\n\n") {
            let block: String = buf.drain(..end + 2).collect();
            let (mut id, mut event, mut data) = (None, String::from("message"), String::new());
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("id:") {
                    id = Some(v.trim().to_string());
                } else if let Some(v) = line.strip_prefix("event:") {
                    event = v.trim().to_string();
                } else if let Some(v) = line.strip_prefix("data:") {
                    data.push_str(v.trim_start());
                }
            }
            if data.is_empty() {
                continue; // the retry hint, a keep-alive
            }
            out.push(Sse { id, event, data: serde_json::from_str(&data).unwrap_or(Value::String(data)) });
            if stop(&out) {
                return out;
            }
        }
    }
    out
}

async fn open_stream(base: &str, id: &str, last_event_id: Option<&str>) -> reqwest::Response {
    let mut r = reqwest::Client::new().get(format!("{base}/tasks/{id}/events")).header("accept", "text/event-stream");
    if let Some(l) = last_event_id {
        r = r.header("last-event-id", l);
    }
    let r = r.send().await.unwrap();
    assert_eq!(r.status(), 200);
    r
}

fn deltas(events: &[Sse]) -> Vec<&Sse> {
    events.iter().filter(|e| e.event == "output_delta").collect()
}

fn joined(events: &[Sse]) -> String {
    deltas(events).iter().map(|e| e.data["text"].as_str().unwrap()).collect()
}

#[tokio::test]
async fn a_streamed_answers_text_arrives_coalesced_in_order_joins_into_the_summary_and_is_never_stored() {
    let (oai, oai_base) = serve("/v1/chat/completions").await;
    let app = app_with(providers(&oai_base, "http://127.0.0.1:9", ""), |_| {}).await;
    // 300 pieces 4 ms apart: about 1.2 s of text, after time for the stream to open.
    let pieces = words(300);
    oai.push(Answer::sse(&text_stream(&pieces), Duration::from_millis(4)).after(Duration::from_millis(800)));
    let t = app.submit(json!({"prompt": "write at length", "model": "local/m"})).await;
    let id = t["id"].as_str().unwrap();
    let events = read_sse(open_stream(&app.base, id, None).await, |_| false).await;
    let done = app.get_task(id).await;
    assert_eq!(done["status"], "completed", "{done}");
    let text: String = pieces.concat();
    assert_eq!(done["summary"], text.as_str());
    let d = deltas(&events);
    // In order, the final turn's text whole: the deltas join into the summary.
    assert_eq!(joined(&events), text);
    assert!(d.iter().all(|e| e.data["turn"] == 1 && e.data["try"] == 1), "{d:?}");
    assert!(d.iter().all(|e| e.id.is_none()), "a delta has no id: it is not in the log");
    // Coalesced: 300 pieces in about 1.2 s come as a few dozen deltas at most (every 50 ms).
    println!("LIVE: 300 pieces came as {} deltas", d.len());
    assert!(d.len() >= 2 && d.len() <= 60, "{} deltas for 300 pieces", d.len());
    // The stored events, every one once, in order, each with its id; the text came before the end.
    let stored: Vec<i64> =
        events.iter().filter(|e| e.event != "output_delta").map(|e| e.data["seq"].as_i64().unwrap()).collect();
    assert_eq!(stored, (1..=stored.len() as i64).collect::<Vec<_>>());
    let last_delta = events.iter().rposition(|e| e.event == "output_delta").unwrap();
    let finished = events.iter().position(|e| e.event == "finished").unwrap();
    assert!(last_delta < finished, "all the text before the end");
    // None stored: the log's pages have no output_delta, and the counts are the events'.
    let page = app.get_json(&format!("/tasks/{id}/events?limit=1000")).await;
    let kinds: Vec<&str> = page["events"].as_array().unwrap().iter().map(|e| e["kind"].as_str().unwrap()).collect();
    assert!(!kinds.contains(&"output_delta"), "{kinds:?}");
    assert_eq!(kinds.len(), stored.len());
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM task_event_log WHERE kind = 'output_delta'")
        .fetch_one(&app.db.pool)
        .await
        .unwrap();
    assert_eq!(n, 0);
    app.stop().await;
}

#[tokio::test]
async fn a_stream_that_reconnects_mid_run_resumes_the_stored_events_without_gap_or_duplicate() {
    let (oai, oai_base) = serve("/v1/chat/completions").await;
    let app = app_with(providers(&oai_base, "http://127.0.0.1:9", ""), |_| {}).await;
    // A tool turn first (events to resume after), then a long streamed answer.
    oai.push(Answer::sse(
        &openai_stream("Looking it up. ", &[("call_1", "nosuch", "{}")], "tool_calls", (10, 5)),
        Duration::from_millis(5),
    ));
    let pieces = words(400);
    // A pause 60 pieces in, for the reconnect to land in however loaded the machine is: text
    // comes after it, whatever the moment the first stream left.
    let mut answer = Answer::sse(&text_stream(&pieces), Duration::from_millis(5)).after(Duration::from_millis(300));
    answer.chunks.as_mut().unwrap()[60].0 = Duration::from_secs(3);
    oai.push(answer);
    let t = app.submit(json!({"prompt": "look, then write", "model": "local/m", "max_turns": 3})).await;
    let id = t["id"].as_str().unwrap();
    // Leave after the first turn's checkpoint and some of the second turn's text.
    let first = read_sse(open_stream(&app.base, id, None).await, |seen| {
        seen.iter().any(|e| e.event == "checkpoint")
            && seen.iter().any(|e| e.event == "output_delta" && e.data["turn"] == 2)
    })
    .await;
    let before: String =
        deltas(&first).iter().filter(|e| e.data["turn"] == 2).map(|e| e.data["text"].as_str().unwrap()).collect();
    assert!(pieces[..60].concat().starts_with(&before), "the first stream left before the pause: {before}");
    let last_id = first.iter().filter_map(|e| e.id.clone()).next_back().unwrap();
    let rest = read_sse(open_stream(&app.base, id, Some(&last_id)).await, |_| false).await;
    let seqs: Vec<i64> = first
        .iter()
        .chain(&rest)
        .filter(|e| e.event != "output_delta")
        .map(|e| e.data["seq"].as_i64().unwrap())
        .collect();
    assert_eq!(seqs, (1..=seqs.len() as i64).collect::<Vec<_>>(), "no gap, no duplicate across the reconnect");
    assert_eq!(rest.last().unwrap().event, "finished");
    // The first turn's text came as turn 1's; the second turn's text, from the reconnect on, is
    // the end of the summary.
    assert!(deltas(&first).iter().any(|e| e.data["turn"] == 1 && e.data["text"] == "Looking it up. "));
    let summary = app.get_task(id).await["summary"].as_str().unwrap().to_string();
    assert_eq!(summary, pieces.concat());
    let later = joined(&rest);
    assert!(!later.is_empty() && summary.ends_with(&later), "the text after the reconnect ends the summary: {later:?}");
    app.stop().await;
}

#[tokio::test]
async fn a_subscriber_on_another_replica_gets_the_text_of_a_run_it_does_not_run() {
    let (oai, oai_base) = serve("/v1/chat/completions").await;
    // The API replica here runs nothing; a worker process runs the task.
    let app = spawn_app_opts(
        |c| c.tool_allow = "*, 127.0.0.1/32".into(),
        AppOptions {
            workers: false,
            providers: providers(&oai_base, "http://127.0.0.1:9", ""),
            ..AppOptions::default()
        },
    )
    .await;
    let cfg = std::env::temp_dir().join(format!("subagentd-live-{}.toml", uuid::Uuid::new_v4()));
    std::fs::write(&cfg, format!("[providers.local]\nkind = \"openai\"\nbase_url = \"{oai_base}/v1\"\n")).unwrap();
    let _worker = spawn_binary(&["worker"], &app.db.url, &[("SUBAGENTD_CONFIG", cfg.to_str().unwrap())]);
    let pieces = words(200);
    // The text starts with fillers, sent until the stream here has seen one: then the watch has
    // reached the worker, wherever it runs, and all of the text that follows must arrive.
    let filler = json!({"choices": [{"index": 0, "delta": {"content": "~ "}}]});
    let (answer, open) = Answer::sse(&text_stream(&pieces), Duration::from_millis(5)).gated(1, &filler);
    oai.push(answer);
    let t = app.submit(json!({"prompt": "write elsewhere", "model": "local/m"})).await;
    let id = t["id"].as_str().unwrap();
    let events = read_sse(open_stream(&app.base, id, None).await, |seen| {
        if seen.iter().any(|e| e.event == "output_delta") {
            let _ = open.send(true);
        }
        false
    })
    .await;
    let _ = std::fs::remove_file(&cfg);
    let done = app.get_task(id).await;
    assert_eq!(done["status"], "completed", "{done}");
    let d = deltas(&events);
    assert!(!d.is_empty(), "the other replica's text arrived");
    let text = joined(&events);
    let after_fillers = text.trim_start_matches("~ ");
    assert!(text.len() > after_fillers.len(), "a filler arrived first: {text}");
    assert_eq!(after_fillers, pieces.concat(), "in order and whole once watched");
    assert!(d.len() < 200, "coalesced at the running replica: {} deltas", d.len());
    app.stop().await;
}
