//! `openapi.yaml` and the router agree: the same (method, path) pairs, and every documented
//! operation reaches a handler on the running app.

use std::collections::BTreeSet;

use serde_json::Value;

use crate::helpers::*;

const METHODS: &[&str] = &["get", "post", "put", "delete", "patch"];

fn documented() -> BTreeSet<(String, String)> {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/openapi.yaml")).unwrap();
    let doc: serde_yaml::Value = serde_yaml::from_str(&text).unwrap();
    let mut out = BTreeSet::new();
    for (path, item) in doc["paths"].as_mapping().expect("paths").iter() {
        for (m, _) in item.as_mapping().unwrap() {
            let m = m.as_str().unwrap();
            if METHODS.contains(&m) {
                out.insert((m.to_string(), path.as_str().unwrap().to_string()));
            }
        }
    }
    out
}

/// Every `.rs` file under `dir`, however deep (a front door may be a folder of its own).
fn sources(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// Every `.route("path", get(h).post(h))` in src/http, its folders included.
fn routed() -> BTreeSet<(String, String)> {
    let mut out = BTreeSet::new();
    let mut files = vec![];
    sources(std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/src/http")), &mut files);
    assert!(files.len() > 10, "the router's sources were not found");
    for path in files {
        let src = std::fs::read_to_string(path).unwrap();
        // rustfmt puts a long route's path on a line of its own.
        let src = src.split(".route(").map(str::trim_start).collect::<Vec<_>>().join(".route(");
        for chunk in src.split(".route(\"").skip(1) {
            let (path, rest) = chunk.split_once('"').unwrap();
            // A catch-all segment (`{*path}`) is a plain parameter in OpenAPI.
            let path = path.replace("{*", "{");
            // The method chain runs to the end of the route(...) call.
            let mut depth = 1;
            let mut end = rest.len();
            for (i, c) in rest.char_indices() {
                match c {
                    '(' => depth += 1,
                    ')' => {
                        depth -= 1;
                        if depth == 0 {
                            end = i;
                            break;
                        }
                    }
                    _ => {}
                }
            }
            let chain = &rest[..end];
            for m in METHODS {
                let called = chain.match_indices(&format!("{m}(")).any(|(i, _)| {
                    i == 0 || !chain.as_bytes()[i - 1].is_ascii_alphanumeric() && chain.as_bytes()[i - 1] != b'_'
                });
                if called {
                    out.insert((m.to_string(), path.clone()));
                }
            }
        }
    }
    out
}

#[test]
fn openapi_documents_exactly_the_routes_the_router_serves() {
    let doc = documented();
    let code = routed();
    assert!(!code.is_empty());
    let undocumented: Vec<_> = code.difference(&doc).collect();
    let unserved: Vec<_> = doc.difference(&code).collect();
    assert!(undocumented.is_empty(), "routes missing from openapi.yaml: {undocumented:?}");
    assert!(unserved.is_empty(), "openapi.yaml documents routes the router lacks: {unserved:?}");
}

#[tokio::test]
async fn every_documented_operation_reaches_a_handler() {
    let app = spawn_app_with(|_| {}, false).await;
    for (m, path) in documented() {
        let path =
            path.replace("{id}", "01900000-0000-7000-8000-000000000000").replace("{name}", "x").replace("{path}", "x");
        let method = reqwest::Method::from_bytes(m.to_uppercase().as_bytes()).unwrap();
        let r = app.client.request(method, app.url(&path)).send().await.unwrap();
        let body: Value = r.json().await.unwrap_or(Value::Null);
        assert_ne!(body["code"], "route_not_found", "{m} {path}");
        assert_ne!(body["code"], "method_not_allowed", "{m} {path}");
    }
    app.stop().await;
}
