//! Every shell example in README.md and docs/*.md runs against the real binary, as written.
//!
//! Each file gets a fresh `subagentd serve` (an empty database, single-user mode on loopback,
//! the mock provider, `SUBAGENTD_ADMIN_TOKEN` set) and its ```sh blocks run in order under
//! `bash -euo pipefail`, with `localhost:8080` meaning that service, `subagentd` on PATH and
//! `DATABASE_URL` set for the CLI. `curl` is a function that checks each answer: 2xx or 3xx,
//! or exactly the status the line after the command announces (`# → 422 …`); a 5xx or no answer
//! always fails. `<id>` is the id of the task the file's examples last got back. Blocks that
//! cannot run here are on `SKIP`, each with its reason; a skip that matches nothing fails too.
//!
//! No tool call of the tasks the examples start may fail (`tool_call_finished` with `is_error`):
//! an example that calls a tool with arguments it refuses fails here, not only in its messages.
//!
//! Also: the configuration table of docs/operations.md names every setting the service reads,
//! and only those.
//!
//! Needs bash, curl and jq: without them the test skips with a notice, unless
//! `SUBAGENTD_REQUIRE_TOOLS=1` (set by `.ci/run`).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use crate::helpers::*;

const ADMIN: &str = "examples-admin-token";

/// Blocks that do not run here: (file, a substring of the block, why).
const SKIP: &[(&str, &str, &str)] = &[
    ("README.md", "cargo run --release -- serve", "the README's two commands: CI runs `scripts/test` itself, and this test is the running service"),
    ("README.md", "pip install ./clients/python", "installs the client libraries into the reader's environment; tests/api/clients.rs runs both libraries' suites against the binary"),
    ("README.md", "docker build -t subagentd .", "needs a container engine (CI has none); tests/api/deploy.rs checks the container files' health check and environment"),
    ("docs/operations.md", "docker run --read-only", "needs a container engine"),
    ("docs/doors.md", "claude mcp add", "needs the Claude Code CLI; tests/api/mcp.rs drives the door with the official MCP SDKs"),
    ("docs/providers.md", "openai/gpt-4o", "needs real provider keys (OpenAI, Anthropic) and a local model server"),
    ("docs/tools.md", "github.com/octo/app.git", "fetches from GitHub (CI has no network); tests/api/workspaces.rs serves git on loopback"),
    ("docs/tools.md", "registry.example.com/team/rust-ci", "pulls an image from a registry (CI has no network); tests/api/images.rs serves a registry on loopback"),
    ("README.md", "registry.example.com/base/python", "pulls an image from a registry (CI has no network); tests/api/images.rs serves a registry on loopback"),
    ("docs/tools.md", "registry.example.com/base/python", "pulls an image from a registry (CI has no network); tests/api/images.rs serves a registry on loopback"),
];

/// A ```sh block: the line its code starts at and the code.
struct Block {
    line: usize,
    code: String,
}

fn sh_blocks(md: &str) -> Vec<Block> {
    let mut out = vec![];
    let mut current: Option<Block> = None;
    for (i, l) in md.lines().enumerate() {
        let fence = l.trim_start();
        match &mut current {
            None if fence.starts_with("```") => {
                if fence.trim_end() == "```sh" {
                    current = Some(Block { line: i + 2, code: String::new() });
                } else {
                    // Another language's block: skip to its end.
                    current = Some(Block { line: 0, code: String::new() });
                }
            }
            None => {}
            Some(_) if fence.starts_with("```") => {
                let b = current.take().unwrap();
                if b.line > 0 {
                    out.push(b);
                }
            }
            Some(b) => {
                b.code.push_str(l);
                b.code.push('\n');
            }
        }
    }
    out
}

/// Where a shell line leaves a statement: inside a quote, a `$(…)`, after a trailing `\`, or
/// with a here-document to read.
#[derive(Default)]
struct Lexer {
    single: bool,
    double: bool,
    depth: i64,
    heredoc: Option<String>,
}

impl Lexer {
    /// Read one line; whether the statement goes on after it.
    fn line(&mut self, l: &str) -> bool {
        if let Some(end) = &self.heredoc {
            if l.trim() == end {
                self.heredoc = None;
            }
            return self.open(false);
        }
        let c: Vec<char> = l.chars().collect();
        let (mut k, mut escaped_end) = (0, false);
        while k < c.len() {
            let ch = c[k];
            if self.single {
                self.single = ch != '\'';
            } else if ch == '\\' {
                escaped_end = k + 1 == c.len();
                k += 1;
            } else if self.double {
                match ch {
                    '"' => self.double = false,
                    '$' if c.get(k + 1) == Some(&'(') => {
                        self.depth += 1;
                        k += 1;
                    }
                    _ => {}
                }
            } else {
                match ch {
                    '\'' => self.single = true,
                    '"' => self.double = true,
                    '#' if k == 0 || c[k - 1].is_whitespace() => break,
                    '$' if c.get(k + 1) == Some(&'(') => {
                        self.depth += 1;
                        k += 1;
                    }
                    ')' if self.depth > 0 => self.depth -= 1,
                    '<' if c.get(k + 1) == Some(&'<') && c.get(k + 2) != Some(&'<') => {
                        let rest: String = c[k + 2..].iter().collect();
                        let word: String = rest
                            .trim_start_matches('-')
                            .trim_start()
                            .trim_start_matches(['\'', '"'])
                            .chars()
                            .take_while(|x| x.is_alphanumeric() || *x == '_')
                            .collect();
                        if !word.is_empty() {
                            self.heredoc = Some(word);
                        }
                        k += 1;
                    }
                    _ => {}
                }
            }
            k += 1;
        }
        self.open(escaped_end)
    }

    fn open(&self, continued: bool) -> bool {
        continued || self.single || self.double || self.depth > 0 || self.heredoc.is_some()
    }
}

/// For each statement of `code` that runs curl: its first and last line (1-based) and the
/// status announced on the line after it (`# → 404 …`), if any.
fn announced(code: &str) -> Vec<(usize, usize, Option<u16>)> {
    let lines: Vec<&str> = code.lines().collect();
    let mut out = vec![];
    let mut i = 0;
    while i < lines.len() {
        let start = i;
        let mut lexer = Lexer::default();
        while lexer.line(lines[i]) && i + 1 < lines.len() {
            i += 1;
        }
        let text = lines[start..=i].join("\n");
        if text.contains("curl ") && !lines[start].trim_start().starts_with('#') {
            let status = lines.get(i + 1).and_then(|n| {
                let n = n.trim_start().strip_prefix("# →")?.trim_start();
                n.get(..3)?.parse::<u16>().ok()
            });
            out.push((start + 1, i + 1, status));
        }
        i += 1;
    }
    out
}

/// The curl the examples call: the real one, its headers kept, its answer checked.
const PRELUDE: &str = r#"
# $1: the script's line (the block's own line + 1: the line sourcing this comes first).
__fail() { echo "EXAMPLE FAILED at the block's line $(($1 - 1)): $2" >&2; echo "line $(($1 - 1)): $2" >> "$EX_STATE/failures"; }
curl() {
  local line=${BASH_LINENO[0]} expect="" s e st row=""
  while read -r s e st; do
    if (( line >= s && line <= e )); then expect=$st; row="$s $e"; fi
  done < "$EX_STATE/announced"
  if [ -n "$expect" ] && [ "$expect" != "-" ]; then echo "$row" >> "$EX_STATE/consumed"; fi
  local id="" args=() hdr="$EX_STATE/headers.$$.$RANDOM" body="$EX_STATE/body.$$.$RANDOM"
  [ -f "$EX_STATE/id" ] && id=$(cat "$EX_STATE/id")
  for a in "$@"; do args+=("${a//__TASK_ID__/$id}"); done
  local rc=0
  command curl -D "$hdr" "${args[@]}" | tee "$body" || rc=${PIPESTATUS[0]}
  local status
  status=$(grep -aoE '^HTTP/[0-9.]+ [0-9]{3}' "$hdr" 2>/dev/null | tail -n1 | awk '{print $2}')
  if [ "$rc" != 0 ] && [ "$rc" != 18 ] || [ -z "$status" ]; then
    __fail "$line" "curl $* exited $rc (status ${status:-none})"; return 1
  fi
  if [ -n "$expect" ] && [ "$expect" != "-" ]; then
    if [ "$status" != "$expect" ]; then __fail "$line" "curl $*: $status, but the example says $expect"; return 1; fi
  elif [ "$status" -ge 400 ]; then
    __fail "$line" "curl $*: $status (an example that expects it says so on the next line: # → $status …)"; return 1
  fi
  local got
  got=$(jq -r 'select(type == "object" and has("id") and has("status")) | .id' "$body" 2>/dev/null || true)
  if [ -n "$got" ] && [ "$got" != null ]; then printf '%s' "$got" > "$EX_STATE/id"; fi
  rm -f "$hdr" "$body"
}
"#;

fn tools_present() -> bool {
    ["bash", "curl", "jq"].iter().all(|t| {
        std::process::Command::new(t)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    })
}

fn documents() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = vec![root.join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    docs.sort();
    files.extend(docs);
    files
}

#[tokio::test]
async fn every_shell_example_in_the_readme_and_the_docs_runs_against_the_binary() {
    if !tools_present() {
        skipped(
            "SUBAGENTD_REQUIRE_TOOLS",
            "the documentation's shell examples",
            "bash, curl or jq is missing",
            "apt-get install curl jq",
        );
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_subagentd")).parent().unwrap().to_path_buf();
    let mut used = vec![false; SKIP.len()];
    let (mut ran, mut skipped, mut failures) = (0, 0, vec![]);
    for file in documents() {
        let rel = file.strip_prefix(root).unwrap().display().to_string();
        let md = std::fs::read_to_string(&file).unwrap();
        let blocks = sh_blocks(&md);
        if blocks.is_empty() {
            continue;
        }
        // A fresh service per file.
        let db = test_db().await;
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let listen = format!("127.0.0.1:{port}");
        let proc =
            spawn_binary(&["serve"], &db.url, &[("SUBAGENTD_LISTEN", &listen), ("SUBAGENTD_ADMIN_TOKEN", ADMIN)]);
        let client = reqwest::Client::new();
        wait_until_ok(&client, &format!("http://{listen}/readyz"), Duration::from_secs(30)).await;
        let state = std::env::temp_dir().join(format!("subagentd-examples-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&state).unwrap();
        for b in blocks {
            if let Some(k) = SKIP.iter().position(|(f, sub, _)| *f == rel && b.code.contains(sub)) {
                used[k] = true;
                skipped += 1;
                continue;
            }
            let code = b
                .code
                .replace("localhost:8080", &listen)
                .replace("127.0.0.1:8080", &listen)
                .replace("<id>", "__TASK_ID__");
            let _ = std::fs::remove_file(state.join("failures"));
            let _ = std::fs::remove_file(state.join("consumed"));
            let script = state.join("block.sh");
            // The prelude sourced on line 1: the block's line numbers are its own, plus one.
            std::fs::write(state.join("prelude.sh"), PRELUDE).unwrap();
            std::fs::write(&script, format!("source \"$EX_STATE/prelude.sh\"\n{code}")).unwrap();
            let statements = announced(&code);
            let table: String = statements
                .iter()
                .map(|(s, e, st)| format!("{} {} {}\n", s + 1, e + 1, st.map_or("-".to_string(), |v| v.to_string())))
                .collect();
            std::fs::write(state.join("announced"), table).unwrap();
            let path = format!("{}:{}", bin_dir.display(), std::env::var("PATH").unwrap_or_default());
            let mut cmd = tokio::process::Command::new("bash");
            cmd.arg("-euo")
                .arg("pipefail")
                .arg(&script)
                .current_dir(&state)
                .env("PATH", path)
                .env("EX_STATE", &state)
                .env("DATABASE_URL", &db.url)
                .env("SUBAGENTD_ADMIN_TOKEN", ADMIN)
                .env("SUBAGENTD_URL", format!("http://{listen}"))
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .kill_on_drop(true);
            let out = match tokio::time::timeout(Duration::from_secs(60), cmd.output()).await {
                Ok(o) => o.unwrap(),
                Err(_) => {
                    failures.push(format!("{rel}:{}: the block ran past 60 s", b.line));
                    continue;
                }
            };
            ran += 1;
            let mut logged = std::fs::read_to_string(state.join("failures")).unwrap_or_default();
            // Every announced status was checked: a curl that bash placed outside its statement's
            // lines would otherwise pass with any 2xx.
            let consumed = std::fs::read_to_string(state.join("consumed")).unwrap_or_default();
            if out.status.success() {
                for (st, en, _) in statements.iter().filter(|(_, _, st)| st.is_some()) {
                    if !consumed.lines().any(|l| l == format!("{} {}", st + 1, en + 1)) {
                        logged.push_str(&format!(
                            "lines {st}-{en}: the status announced after them was never checked (no curl ran there)\n"
                        ));
                    }
                }
            }
            if !out.status.success() || !logged.is_empty() {
                failures.push(format!(
                    "{rel}:{} (block starting there; example line numbers count from it):\n{}\n--- found\n{logged}--- stdout\n{}\n--- stderr\n{}",
                    b.line,
                    b.code,
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                ));
            }
        }
        // The tool calls the examples' tasks made all went through: a call that failed (say,
        // with arguments the tool refuses) would leave a summary that looks fine.
        let ids: Vec<String> = sqlx::query_scalar("SELECT id::text FROM tasks").fetch_all(&db.pool).await.unwrap();
        for id in ids {
            let events: serde_json::Value =
                client.get(format!("http://{listen}/tasks/{id}/events")).send().await.unwrap().json().await.unwrap();
            for e in events["events"].as_array().into_iter().flatten() {
                if e["kind"] == "tool_call_finished" && e["data"]["is_error"] == true {
                    failures.push(format!("{rel}: a tool call of task {id} failed: {}", e["data"]));
                }
            }
        }
        drop(proc);
        let _ = std::fs::remove_dir_all(&state);
    }
    for (k, (f, sub, _)) in SKIP.iter().enumerate() {
        assert!(used[k], "the skip list's entry ({f}, {sub:?}) matches no block: remove it");
    }
    println!("EXAMPLES: {ran} blocks ran, {skipped} skipped (see SKIP)");
    assert!(ran >= 10, "only {ran} example blocks ran");
    assert!(failures.is_empty(), "{} example block(s) failed:\n\n{}", failures.len(), failures.join("\n\n"));
}

#[test]
fn a_statement_spans_its_continuations_and_open_quotes_and_takes_the_status_announced_after_it() {
    let code = "curl -s a \\\n  -d '{\"x\":\n  1}'\n# → 422 {…}\nX=$(curl -s b |\n jq .id)\necho hi\ncurl c\n";
    assert_eq!(announced(code), vec![(1, 3, Some(422)), (5, 6, None), (8, 8, None)]);
    // A here-document is part of its statement; an apostrophe in double quotes or in a comment
    // opens nothing.
    let code = "curl -s -X PUT x --data-binary @- <<'EOF'\n---\nname: it's\nEOF\n# → 201 {…}\n\
                curl -s -d \"it's\" y   # it's here\ncurl z\n# → 404\n";
    assert_eq!(announced(code), vec![(1, 4, Some(201)), (6, 6, None), (7, 7, Some(404))]);
}

#[test]
fn the_configuration_table_in_the_docs_lists_every_setting_and_only_those() {
    let table = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/operations.md")).unwrap();
    let known = crate::deploy::settings_read();
    let re = regex_lite::Regex::new(r"`((?:SUBAGENTD_|DATABASE_URL)[A-Z0-9_]*)`").unwrap();
    let rows: std::collections::BTreeSet<String> = table
        .lines()
        .filter(|l| l.starts_with('|'))
        .flat_map(|l| re.captures_iter(l).map(|c| c[1].to_string()).collect::<Vec<_>>())
        .collect();
    for name in known.iter().filter(|n| n.starts_with("SUBAGENTD_") || *n == "DATABASE_URL") {
        assert!(rows.contains(name), "docs/operations.md's configuration table lacks {name}");
    }
    for name in &rows {
        assert!(known.contains(name), "docs/operations.md's tables name {name}, which the service does not read");
    }
}
