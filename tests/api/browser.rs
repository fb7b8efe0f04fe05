//! A real browser for the console's tests: Debian's headless Chromium driven over WebDriver
//! (chromedriver) with `fantoccini`, one at a time. Without Chromium the tests skip with a
//! notice — unless `SUBAGENTD_REQUIRE_BROWSER=1` (set by `.ci/run`), which makes that a failure.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{json, Value};

use crate::helpers::{skipped, Proc};

const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// One browser runs at a time: each is a few hundred MB and a core's worth of work.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

pub struct Browser {
    pub client: Client,
    driver_url: String,
    _driver: Proc,
    _profile: TempDir,
    _turn: tokio::sync::MutexGuard<'static, ()>,
}

struct TempDir(std::path::PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A headless Chromium at `width`×`height`, or `None` (with a notice) when it is not installed.
pub async fn browser(width: u32, height: u32) -> Option<Browser> {
    let present = std::path::Path::new(CHROMIUM).exists() && std::path::Path::new(CHROMEDRIVER).exists();
    if !present {
        skipped(
            "SUBAGENTD_REQUIRE_BROWSER",
            "the console's browser tests",
            &format!("no {CHROMIUM} or {CHROMEDRIVER}"),
            "apt-get install chromium chromium-driver",
        );
        return None;
    }
    let turn = ONE_AT_A_TIME.lock().await;
    let port = free_port();
    let driver = Proc {
        child: Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromedriver"),
    };
    let profile = TempDir(std::env::temp_dir().join(format!("subagentd-chromium-{}", uuid::Uuid::new_v4())));
    let caps = json!({
        "browserName": "chrome",
        "goog:chromeOptions": {
            "binary": CHROMIUM,
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic",
                     "--no-first-run", "--disable-background-networking", "--disable-component-update",
                     "--disable-sync", "--hide-scrollbars", format!("--window-size={width},{height}"),
                     format!("--user-data-dir={}", profile.0.display())]
        },
        "goog:loggingPrefs": {"browser": "ALL"}
    });
    let driver_url = format!("http://127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(20);
    let client = loop {
        let mut b = ClientBuilder::rustls().expect("TLS roots");
        b.capabilities(caps.as_object().unwrap().clone());
        match b.connect(&driver_url).await {
            Ok(c) => break c,
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("chromedriver did not start a session: {e}"),
        }
    };
    Some(Browser { client, driver_url, _driver: driver, _profile: profile, _turn: turn })
}

impl Browser {
    /// The element `css` once it exists (within 15 s).
    pub async fn wait_for(&self, css: &str) -> fantoccini::elements::Element {
        self.client
            .wait()
            .at_most(Duration::from_secs(15))
            .for_element(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("no {css}: {e}"))
    }

    /// Wait until the script (a function body returning a boolean) is true, within 20 s.
    pub async fn wait_until(&self, what: &str, script: &str) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if self.js(script).await == Value::Bool(true) {
                return;
            }
            assert!(Instant::now() < deadline, "not in time: {what}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Run `script` (a function body) in the page and give its result.
    pub async fn js(&self, script: &str) -> Value {
        self.client.execute(script, vec![]).await.unwrap_or_else(|e| panic!("script failed: {e}\n{script}"))
    }

    pub async fn text(&self, css: &str) -> String {
        self.wait_for(css).await.text().await.unwrap()
    }

    /// The browser's console messages at level SEVERE since the last call (chromedriver's log).
    pub async fn severe_logs(&self) -> Vec<String> {
        let sid = self.client.session_id().await.unwrap().unwrap();
        let r: Value = reqwest::Client::new()
            .post(format!("{}/session/{sid}/se/log", self.driver_url))
            .json(&json!({"type": "browser"}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        r["value"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|e| e["level"] == "SEVERE")
            .map(|e| e["message"].as_str().unwrap_or_default().to_string())
            .collect()
    }

    /// A screenshot, checked to be a PNG; written to `docs/<name>.png` when
    /// `SUBAGENTD_SCREENSHOTS=1` (how the README's pictures are refreshed).
    pub async fn screenshot(&self, name: &str) -> Vec<u8> {
        let png = self.client.screenshot().await.unwrap();
        assert!(png.starts_with(b"\x89PNG") && png.len() > 4000, "{name}: not a picture");
        if std::env::var("SUBAGENTD_SCREENSHOTS").is_ok_and(|v| v == "1") {
            let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/docs");
            std::fs::create_dir_all(dir).unwrap();
            std::fs::write(format!("{dir}/{name}.png"), &png).unwrap();
        }
        png
    }

    pub async fn close(self) {
        let _ = self.client.close().await;
    }
}
