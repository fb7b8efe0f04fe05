//! Held connections: a tenant's event streams and waits are capped per replica, so that one
//! tenant cannot take the service from the others; connections beyond the replica's cap are
//! answered at once; a reader that stops reading is cut; request heads are bounded.

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::helpers::*;

const ADMIN: &str = "admin-secret";

async fn app() -> TestApp {
    spawn_app_with(|c| c.admin_token = Some(ADMIN.into()), true).await
}

/// Set `tenant`'s limits through the admin API.
async fn limits(app: &TestApp, tenant: &str, l: Value) {
    let r =
        app.client.put(app.url(&format!("/admin/tenants/{tenant}"))).bearer_auth(ADMIN).json(&l).send().await.unwrap();
    assert!(r.status().is_success(), "{}", r.text().await.unwrap());
}

/// A task of `key`'s tenant that runs for a while.
async fn long_task(app: &TestApp, key: &str) -> String {
    let r = app
        .client
        .post(app.url("/tasks"))
        .bearer_auth(key)
        .json(&json!({"prompt": "slow [mock:delay_ms=30000]", "model": "mock/m"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    r.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_string()
}

async fn stream(app: &TestApp, key: &str, id: &str) -> reqwest::Response {
    app.client
        .get(app.url(&format!("/tasks/{id}/events")))
        .bearer_auth(key)
        .header("accept", "text/event-stream")
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn a_tenant_at_its_stream_limit_is_refused_429_its_extra_waits_answer_at_once_and_others_go_on() {
    let app = app().await;
    let (a, b) = (admin_key(&app, ADMIN, "a").await, admin_key(&app, ADMIN, "b").await);
    limits(&app, "a", json!({"max_streams": 2, "max_waits": 1})).await;
    let task = long_task(&app, &a).await;
    let (s1, s2) = (stream(&app, &a, &task).await, stream(&app, &a, &task).await);
    assert_eq!((s1.status().as_u16(), s2.status().as_u16()), (200, 200));
    let refused = stream(&app, &a, &task).await;
    assert_eq!(refused.headers().get("connection").map(|v| v.to_str().unwrap()), Some("close"));
    assert!(refused.headers().contains_key("retry-after"));
    let p = assert_problem(refused, 429, "stream_limit_reached").await;
    assert_eq!((p["limit"].as_u64(), p["current"].as_u64()), (Some(2), Some(2)), "{p}");
    assert!(p["detail"].as_str().unwrap().contains("on this replica"), "{p}");
    // The JSON pages are no stream: still served.
    let r = app.client.get(app.url(&format!("/tasks/{task}/events"))).bearer_auth(&a).send().await.unwrap();
    assert_eq!(r.status(), 200);

    // One wait is held; the next is answered at once with the task as it stands.
    let client = app.client.clone();
    let (url, key) = (app.url(&format!("/tasks/{task}?wait=true&timeout=20")), a.clone());
    let held = tokio::spawn(async move { client.get(url).bearer_auth(key).send().await.unwrap().status() });
    let deadline = Instant::now() + Duration::from_secs(10);
    while overview_holds(&app, &a).await["waits"] != 1 {
        assert!(Instant::now() < deadline, "the first wait was never held");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let r =
        app.client.get(app.url(&format!("/tasks/{task}?wait=true&timeout=20"))).bearer_auth(&a).send().await.unwrap();
    assert_eq!(r.status(), 202, "answered at once, as if its wait had run out");
    assert_eq!(r.headers()["location"], format!("/tasks/{task}"));
    let r = app
        .client
        .post(app.url("/tasks?wait=true&timeout=20"))
        .bearer_auth(&a)
        .json(&json!({"prompt": "also slow [mock:delay_ms=30000]", "model": "mock/m"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202, "a waiting submission too: the task is created, the wait is not held");

    // Tenant B meanwhile: its wait, its stream, its task done.
    let r = app
        .client
        .post(app.url("/tasks?wait=true&timeout=20"))
        .bearer_auth(&b)
        .json(&json!({"prompt": "quick [mock:reply=done]", "model": "mock/m"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let done: Value = r.json().await.unwrap();
    assert_eq!(done["status"], "completed");
    let b_task = long_task(&app, &b).await;
    assert_eq!(stream(&app, &b, &b_task).await.status(), 200);

    // The counts, as the overview (and the console) shows them, and the refusals in /metrics.
    let held_a = overview_holds(&app, &a).await;
    assert_eq!((held_a["streams"].as_u64(), held_a["max_streams"].as_u64()), (Some(2), Some(2)), "{held_a}");
    let metrics = app.client.get(app.url("/metrics")).send().await.unwrap().text().await.unwrap();
    assert!(metrics.contains(r#"subagentd_hold_refusals_total{tenant="a",limit="max_streams"} 1"#), "{metrics}");
    assert!(metrics.contains(r#"subagentd_open_streams{tenant="a"} 2"#), "{metrics}");

    // A closes one stream: it can open one again.
    drop(s1);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = stream(&app, &a, &task).await;
        if r.status() == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "the closed stream's place never came back");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop((s2, held));
}

/// The caller's tenant's holds on the replica, as `GET /overview` shows them.
async fn overview_holds(app: &TestApp, key: &str) -> Value {
    let o: Value = app.client.get(app.url("/overview")).bearer_auth(key).send().await.unwrap().json().await.unwrap();
    o["this_replica"]["holds"].as_array().and_then(|h| h.first().cloned()).unwrap_or(json!({"streams": 0, "waits": 0}))
}

#[tokio::test]
async fn request_headers_over_32_kib_are_refused_with_431() {
    let app = spawn_app().await;
    let big = "x".repeat(64 * 1024);
    let r = app.client.get(app.url("/healthz")).header("x-big", big).send().await.unwrap();
    assert_eq!(r.status(), 431);
    // And one of a reasonable size still passes.
    let r = app.client.get(app.url("/healthz")).header("x-big", "x".repeat(8 * 1024)).send().await.unwrap();
    assert_eq!(r.status(), 200);
}

/// A TCP connection that asks for the stream and never reads, with a small receive buffer.
fn stalled_reader(port: u16, path: &str) -> std::net::TcpStream {
    use std::os::fd::FromRawFd;
    // SAFETY: a fresh socket, its receive buffer set before it connects; the descriptor is
    // handed to the TcpStream, which owns it from then on.
    let s = unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0);
        assert!(fd >= 0);
        let n: libc::c_int = 4096;
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            (&n as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
        let addr = libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: port.to_be(),
            sin_addr: libc::in_addr { s_addr: u32::from_ne_bytes([127, 0, 0, 1]) },
            sin_zero: [0; 8],
        };
        let rc = libc::connect(
            fd,
            (&addr as *const libc::sockaddr_in).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        );
        assert_eq!(rc, 0, "connect");
        std::net::TcpStream::from_raw_fd(fd)
    };
    let mut s = s;
    write!(s, "GET {path} HTTP/1.1\r\nhost: localhost\r\naccept: text/event-stream\r\n\r\n").unwrap();
    s
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .unwrap()
        .trim()
        .trim_end_matches(" kB")
        .trim()
        .parse()
        .unwrap()
}

/// How many stalled readers, and how much the binary's resident memory may grow for them.
const STALLED: usize = 50;
const RSS_BOUND_KIB: u64 = 64 * 1024;

#[tokio::test]
async fn readers_that_stop_reading_are_cut_after_the_stall_and_cost_bounded_memory() {
    let db = test_db().await;
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let svc = spawn_binary(
        &["serve"],
        &db.url,
        &[
            ("SUBAGENTD_LISTEN", &format!("127.0.0.1:{port}")),
            ("SUBAGENTD_STREAM_STALL_SECONDS", "2"),
            ("SUBAGENTD_SOCKET_SEND_BUFFER", "4096"),
        ],
    );
    let client = reqwest::Client::new();
    let base = format!("http://127.0.0.1:{port}");
    wait_until_ok(&client, &format!("{base}/readyz"), Duration::from_secs(20)).await;
    // A finished task with a long event log: more than both sockets' buffers hold.
    let r = client
        .post(format!("{base}/tasks?wait=true&timeout=60"))
        // (Each turn calls a tool it is not offered: refused, and on to the next turn.)
        .json(&json!({"prompt": "many turns [mock:tool_turns=40]", "model": "mock/m", "max_turns": 50}))
        .send()
        .await
        .unwrap();
    let t: Value = r.json().await.unwrap();
    let id = t["id"].as_str().unwrap().to_string();
    let before = rss_kib(svc.child.id());
    let readers: Vec<std::net::TcpStream> =
        (0..STALLED).map(|_| stalled_reader(port, &format!("/tasks/{id}/events"))).collect();
    // Each is cut once it has stalled: the server closes its end, which the reader sees as EOF
    // (or a reset) once it reads what was buffered.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let after = rss_kib(svc.child.id());
    let metrics = client.get(format!("{base}/metrics")).send().await.unwrap().text().await.unwrap();
    let stalls: f64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("subagentd_stream_stalls_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0);
    assert_eq!(stalls as usize, STALLED, "every stalled reader was cut and counted");
    for mut r in readers {
        r.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut buf = vec![0u8; 1 << 20];
        let mut total = 0;
        loop {
            match r.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => total += n,
            }
        }
        assert!(total > 0, "it got the start of the stream");
    }
    assert!(
        after.saturating_sub(before) < RSS_BOUND_KIB,
        "{STALLED} stalled readers grew the binary's RSS by {} KiB (bound {RSS_BOUND_KIB} KiB)",
        after.saturating_sub(before)
    );
    // The replica goes on serving.
    assert_eq!(client.get(format!("{base}/tasks/{id}")).send().await.unwrap().status(), 200);
}

/// The test's own soft descriptor limit, raised to its hard limit.
fn raise_own_nofile() -> u64 {
    let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit and setrlimit with a pointer to an rlimit of this frame.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut r);
        r.rlim_cur = r.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &r);
    }
    r.rlim_cur
}

fn gauge(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(name).and_then(|v| v.strip_prefix(' ')))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in /metrics"))
}

/// A plain request on a fresh connection: its status line and how long it took. Beyond the cap
/// the service waits 50 ms for a request's head, then answers 503 and closes: on a loaded machine
/// this client's write can come later than that, and then fails or goes unanswered; such a try
/// is made again, for up to 10 s, and what each failed try met is in the message if none works.
fn raw_request(port: u16, path: &str) -> (String, Duration) {
    let mut tries = vec![];
    let until = Instant::now() + Duration::from_secs(10);
    while tries.is_empty() || Instant::now() < until {
        let t = Instant::now();
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        if let Err(e) = write!(s, "GET {path} HTTP/1.1\r\nhost: localhost\r\n\r\n") {
            tries.push(format!("write: {e} after {:?}", t.elapsed()));
            continue;
        }
        let mut buf = [0u8; 512];
        let n = match s.read(&mut buf) {
            Ok(n) => n,
            Err(e) => {
                tries.push(format!("read: {e} after {:?}", t.elapsed()));
                continue;
            }
        };
        let head = String::from_utf8_lossy(&buf[..n]).lines().next().unwrap_or("").to_string();
        if !head.is_empty() {
            return (head, t.elapsed());
        }
        tries.push(format!("closed with nothing after {:?}", t.elapsed()));
    }
    panic!("no answer to GET {path} in 10 s: {tries:?}");
}

#[tokio::test]
async fn under_1024_descriptors_one_tenant_flooding_streams_and_waits_leaves_the_replica_to_the_others() {
    assert!(raise_own_nofile() >= 4096, "this test holds about 1,500 sockets: raise the hard descriptor limit");
    let db = test_db().await;
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let log_path = std::env::temp_dir().join(format!("subagentd-flood-{}.log", uuid::Uuid::new_v4()));
    let log = std::fs::File::create(&log_path).unwrap();
    let _svc = spawn_binary_with(
        &["serve"],
        &db.url,
        &[
            ("SUBAGENTD_LISTEN", &format!("127.0.0.1:{port}")),
            ("SUBAGENTD_ADMIN_TOKEN", ADMIN),
            ("SUBAGENTD_MAX_RUNNING", "8"),
            ("RUST_LOG", "info"),
        ],
        Limited { nofile: Some(1024), stderr: Some(log) },
    );
    let client = reqwest::Client::builder().pool_max_idle_per_host(0).build().unwrap();
    let base = format!("http://127.0.0.1:{port}");
    wait_until_ok(&client, &format!("{base}/readyz"), Duration::from_secs(20)).await;
    let metrics = client.get(format!("{base}/metrics")).send().await.unwrap().text().await.unwrap();
    let cap = gauge(&metrics, "subagentd_connection_cap") as usize;
    assert!((400..1024).contains(&cap), "the cap is what 1,024 descriptors leave after the reserve: {cap}");
    let key = |tenant: &'static str| {
        let (client, base) = (client.clone(), base.clone());
        async move {
            let r = client
                .post(format!("{base}/admin/keys"))
                .bearer_auth(ADMIN)
                .json(&json!({"tenant": tenant}))
                .send()
                .await
                .unwrap();
            r.json::<Value>().await.unwrap()["key"].as_str().unwrap().to_string()
        }
    };
    let (a, b) = (key("a").await, key("b").await);
    let (max_streams, max_waits) = (cap / 3, cap / 6);
    let r = client
        .put(format!("{base}/admin/tenants/a"))
        .bearer_auth(ADMIN)
        .json(&json!({"max_streams": max_streams, "max_waits": max_waits}))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success());
    let submit = |key: &str, prompt: &str, wait: bool| {
        let url = format!("{base}/tasks{}", if wait { "?wait=true&timeout=60" } else { "" });
        client.post(url).bearer_auth(key).json(&json!({"prompt": prompt, "model": "mock/m"})).send()
    };
    // B's run in flight through the whole flood.
    let r = submit(&b, "through the flood [mock:tool_turns=3] [mock:delay_ms=1500]", false).await.unwrap();
    let in_flight: Value = r.json().await.unwrap();
    let a_task: Value = submit(&a, "long [mock:delay_ms=60000]", false).await.unwrap().json().await.unwrap();
    let a_task = a_task["id"].as_str().unwrap().to_string();
    let events = |key: &str, id: &str| {
        client.get(format!("{base}/tasks/{id}/events")).bearer_auth(key).header("accept", "text/event-stream").send()
    };

    // A opens streams until refused: exactly at its cap.
    let mut streams = vec![];
    let refused = loop {
        let r = events(&a, &a_task).await.unwrap();
        if r.status() != 200 {
            break r;
        }
        streams.push(r);
        assert!(streams.len() <= max_streams, "more streams than max_streams");
    };
    assert_eq!(streams.len(), max_streams);
    assert_problem(refused, 429, "stream_limit_reached").await;
    // Its waits: up to max_waits held, the rest answered at once.
    let mut waits = vec![];
    for _ in 0..max_waits {
        let (c, url, key) = (client.clone(), format!("{base}/tasks/{a_task}?wait=true&timeout=60"), a.clone());
        waits.push(tokio::spawn(async move { c.get(url).bearer_auth(key).send().await.map(|r| r.status()) }));
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let m = client.get(format!("{base}/metrics")).send().await.unwrap().text().await.unwrap();
        if m.contains(&format!("subagentd_open_waits{{tenant=\"a\"}} {max_waits}")) {
            break;
        }
        assert!(Instant::now() < deadline, "A's waits were not all held");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let r = client.get(format!("{base}/tasks/{a_task}?wait=true&timeout=60")).bearer_auth(&a).send().await.unwrap();
    assert_eq!(r.status(), 202, "A's extra wait is answered at once");

    // The same at the other doors: A's streams refused with 429, its waits answered at once.
    let mcp = Mcp::open(&client, &base, &a).await;
    let r = mcp.call(&client, "tasks/result", json!({"taskId": a_task})).await;
    assert_eq!(r.status(), 429, "MCP tasks/result is a stream: refused at A's cap");
    let t = Instant::now();
    let r: Value = mcp
        .call(&client, "tools/call", json!({"name": "task_wait", "arguments": {"task_id": a_task}}))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(r["result"]["structuredContent"]["status"], "running", "MCP task_wait answered at once: {r}");
    assert!(t.elapsed() < Duration::from_secs(10), "not held for the MCP wait ({:?})", t.elapsed());
    let a2a = |key: &str, method: &str, params: Value| {
        client
            .post(format!("{base}/a2a"))
            .bearer_auth(key)
            .header("a2a-version", "1.0")
            .json(&json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}))
            .send()
    };
    let msg = |id: &str, text: &str| {
        json!({"message": {"messageId": id, "role": "ROLE_USER", "parts": [{"text": text}],
                                                          "metadata": {"model": "mock/m"}}})
    };
    let r = a2a(&a, "SendStreamingMessage", msg("a-stream", "x")).await.unwrap();
    assert_eq!(r.status(), 429, "A2A SendStreamingMessage refused at A's cap");
    let r = a2a(&a, "SubscribeToTask", json!({"id": a_task})).await.unwrap();
    assert_eq!(r.status(), 429, "A2A SubscribeToTask refused at A's cap");
    let t = Instant::now();
    let r: Value =
        a2a(&a, "SendMessage", msg("a-wait", "long [mock:delay_ms=60000]")).await.unwrap().json().await.unwrap();
    let state = r["result"]["task"]["status"]["state"].as_str().unwrap_or_default().to_string();
    assert!(
        ["TASK_STATE_SUBMITTED", "TASK_STATE_WORKING"].contains(&state.as_str()),
        "A2A blocking send answered at once: {r}"
    );
    assert!(t.elapsed() < Duration::from_secs(10), "not held for the A2A wait ({:?})", t.elapsed());
    // B, at both doors, through the flood.
    let mcp_b = Mcp::open(&client, &base, &b).await;
    let r: Value = mcp_b
        .call(
            &client,
            "tools/call",
            json!({"name": "task", "arguments": {"subagent_type": "general",
              "description": "B at the MCP door", "prompt": "p [mock:reply=mcp fine]", "model": "mock/m"}}),
        )
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(r["result"]["structuredContent"]["summary"], "mcp fine", "{r}");
    let r: Value =
        a2a(&b, "SendMessage", msg("b-wait", "p [mock:reply=a2a fine]")).await.unwrap().json().await.unwrap();
    assert_eq!(r["result"]["task"]["status"]["state"], "TASK_STATE_COMPLETED", "{r}");

    // B meanwhile: a wait that completes, and a stream of its events.
    let r = submit(&b, "while A floods [mock:reply=fine]", true).await.unwrap();
    assert_eq!(r.status(), 200);
    let done: Value = r.json().await.unwrap();
    assert_eq!(done["status"], "completed");
    let r = events(&b, done["id"].as_str().unwrap()).await.unwrap();
    assert_eq!(r.status(), 200);
    let body = r.text().await.unwrap();
    assert!(body.contains("event: finished"), "B's stream ends with its task: {body}");

    // A lets go, and can open again.
    drop(streams);
    for w in waits {
        w.abort();
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    let again = loop {
        let r = events(&a, &a_task).await.unwrap();
        if r.status() == 200 {
            break r;
        }
        assert!(Instant::now() < deadline, "A's streams were never freed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    drop(again);

    // Beyond the replica's cap: idle connections fill it, and the next are answered at once.
    let deadline = Instant::now() + Duration::from_secs(20);
    while gauge(
        &client.get(format!("{base}/metrics")).send().await.unwrap().text().await.unwrap(),
        "subagentd_connections",
    ) > 2.0
    {
        assert!(Instant::now() < deadline, "A's connections were never closed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let idle: Vec<std::net::TcpStream> =
        (0..cap).map(|_| std::net::TcpStream::connect(("127.0.0.1", port)).unwrap()).collect();
    let deadline = Instant::now() + Duration::from_secs(10);
    let (over, took) = loop {
        let (head, took) = raw_request(port, "/tasks");
        if head.contains("503") {
            break (head, took);
        }
        assert!(Instant::now() < deadline, "never answered 503 beyond the cap: {head}");
    };
    println!("HOLDS: beyond the cap of {cap}, a request was answered {over:?} in {took:?}");
    assert!(took < Duration::from_secs(1), "answered at once: {took:?}");
    assert!(raw_request(port, "/readyz").0.contains("503"));
    assert!(raw_request(port, "/healthz").0.contains("200"));
    for door in ["/mcp", "/a2a", "/.well-known/agent-card.json"] {
        assert!(raw_request(port, door).0.contains("503"), "{door} beyond the cap");
    }
    drop(idle);

    // It recovers.
    wait_until_ok(&client, &format!("{base}/readyz"), Duration::from_secs(20)).await;
    let r = submit(&b, "after [mock:reply=ok]", true).await.unwrap();
    assert_eq!(r.status(), 200);
    // B's run went through it all: one attempt, never rescued, every call recorded as served.
    let id = in_flight["id"].as_str().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let t = loop {
        let t: Value =
            client.get(format!("{base}/tasks/{id}")).bearer_auth(&b).send().await.unwrap().json().await.unwrap();
        if t["status"] != "running" && t["status"] != "queued" {
            break t;
        }
        assert!(Instant::now() < deadline, "B's run never ended: {t}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!((t["status"].as_str(), t["attempt"].as_i64()), (Some("completed"), Some(1)), "{t}");
    let ev: Value =
        client.get(format!("{base}/tasks/{id}/events")).bearer_auth(&b).send().await.unwrap().json().await.unwrap();
    let kinds: Vec<&str> = ev["events"].as_array().unwrap().iter().map(|e| e["kind"].as_str().unwrap()).collect();
    assert!(!kinds.contains(&"rescued") && !kinds.contains(&"llm_call_failed"), "{kinds:?}");
    let log = std::fs::read_to_string(&log_path).unwrap();
    let _ = std::fs::remove_file(&log_path);
    assert!(!log.contains("Too many open files"), "the log met EMFILE");
    assert!(log.contains("connections: descriptor budget"), "the start-up log names the budget");
}

/// An MCP session at `/mcp`, as raw JSON-RPC.
struct Mcp {
    base: String,
    key: String,
    session: String,
}

impl Mcp {
    async fn open(client: &reqwest::Client, base: &str, key: &str) -> Mcp {
        let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": "2025-11-25",
                          "capabilities": {}, "clientInfo": {"name": "flood", "version": "1"}}});
        let r = client
            .post(format!("{base}/mcp"))
            .bearer_auth(key)
            .header("accept", "application/json, text/event-stream")
            .json(&init)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let session = r.headers()["mcp-session-id"].to_str().unwrap().to_string();
        Mcp { base: base.into(), key: key.into(), session }
    }

    async fn call(&self, client: &reqwest::Client, method: &str, params: Value) -> reqwest::Response {
        client
            .post(format!("{}/mcp", self.base))
            .bearer_auth(&self.key)
            .header("accept", "application/json, text/event-stream")
            .header("mcp-session-id", &self.session)
            .json(&json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}))
            .send()
            .await
            .unwrap()
    }
}
