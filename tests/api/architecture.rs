//! The layering of `src/` as `ARCHITECTURE.md` states it: every import between the service's
//! modules is one that its code map's "may import" column allows, no import cycle runs between
//! files, and no function is longer than a screenful and a half (120 lines).
//!
//! Read from the source as text: every `crate::`, `super::` and `self::` path (use trees
//! expanded), in code — comments and `#[cfg(test)]` modules are not the architecture. A path is
//! resolved to the file of its longest prefix that is a module. A folder's `mod.rs` composing
//! and re-exporting its own files is not an edge (it is the folder's front door).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

type Module = Vec<String>;

struct Source {
    /// `src/`-relative path, for messages.
    rel: String,
    code: String,
}

fn src_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every `.rs` file of `src/` by its module path (`src/lib.rs`: the crate root, `[]`).
fn sources() -> BTreeMap<Module, Source> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    let root = src_root();
    let mut files = vec![];
    walk(&root, &mut files);
    let mut out = BTreeMap::new();
    for p in files {
        let rel = p.strip_prefix(&root).unwrap().to_string_lossy().replace('\\', "/");
        let mut m: Module = rel.trim_end_matches(".rs").split('/').map(str::to_string).collect();
        if m.last().is_some_and(|l| l == "mod") {
            m.pop();
        }
        if m == ["lib"] {
            m.clear();
        }
        let code = strip(&std::fs::read_to_string(&p).unwrap());
        out.insert(m, Source { rel, code });
    }
    out
}

/// The code without comments, string literals' contents, and `#[cfg(test)] mod …` blocks.
fn strip(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    while i < b.len() {
        if b[i..].starts_with(b"//") {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i..].starts_with(b"/*") {
            let mut depth = 0;
            while i < b.len() {
                if b[i..].starts_with(b"/*") {
                    depth += 1;
                    i += 2;
                } else if b[i..].starts_with(b"*/") {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if b[i] == b'"' && !(i > 0 && b[i - 1] == b'\'') {
            // A string: skipped (raw strings of r"…" and r#"…"# too).
            let hashes = if i > 0 && (b[i - 1] == b'r' || b[i - 1] == b'#') {
                let mut h = 0;
                let mut j = i;
                while j > 0 && b[j - 1] == b'#' {
                    h += 1;
                    j -= 1;
                }
                Some(h)
            } else {
                None
            };
            i += 1;
            while i < b.len() {
                match hashes {
                    None if b[i] == b'\\' => i += 2,
                    None if b[i] == b'"' => break,
                    Some(h) if b[i] == b'"' && b[i + 1..].iter().take(h).filter(|c| **c == b'#').count() == h => {
                        i += h;
                        break;
                    }
                    _ => i += 1,
                }
            }
            i += 1;
            out.push_str("\"\"");
        } else {
            out.push(b[i] as char);
            i += 1;
        }
    }
    match out.find("#[cfg(test)]\nmod ").or_else(|| out.find("#[cfg(test)]\npub mod ")) {
        Some(at) => out[..at].to_string(),
        None => out,
    }
}

/// Every path of the code that starts at `crate`, `super` or `self`, use trees expanded.
fn paths(code: &str) -> Vec<Vec<String>> {
    fn ident_end(b: &[u8], mut i: usize) -> usize {
        while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
            i += 1;
        }
        i
    }
    /// A path from `i` (`a::b::c`, or `a::{…}`), its segments pushed on `prefix`.
    fn read(b: &[u8], mut i: usize, mut prefix: Vec<String>, out: &mut Vec<Vec<String>>) -> usize {
        loop {
            while i < b.len() && b[i].is_ascii_whitespace() {
                i += 1;
            }
            if i < b.len() && b[i] == b'{' {
                i += 1;
                loop {
                    while i < b.len() && (b[i].is_ascii_whitespace() || b[i] == b',') {
                        i += 1;
                    }
                    if i >= b.len() || b[i] == b'}' {
                        return i + 1;
                    }
                    i = read(b, i, prefix.clone(), out);
                    // Skip an `as name` or anything up to the item's end.
                    while i < b.len() && b[i] != b',' && b[i] != b'}' {
                        i += 1;
                    }
                }
            }
            let end = ident_end(b, i);
            if end == i {
                out.push(prefix);
                return i;
            }
            prefix.push(String::from_utf8_lossy(&b[i..end]).into_owned());
            i = end;
            if b[i..].starts_with(b"::") {
                i += 2;
            } else {
                out.push(prefix);
                return i;
            }
        }
    }
    let b = code.as_bytes();
    let mut out = vec![];
    let mut i = 0;
    while i < b.len() {
        let start_ok = i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_' || b[i - 1] == b':');
        let word = ["crate::", "super::", "self::"].into_iter().find(|w| b[i..].starts_with(w.as_bytes()));
        match word {
            Some(w) if start_ok => {
                let first = w.trim_end_matches("::").to_string();
                let mut j = i + w.len();
                let mut prefix = vec![first];
                // super::super::…
                while b[j..].starts_with(b"super::") {
                    prefix.push("super".into());
                    j += "super::".len();
                }
                i = read(b, j, prefix, &mut out).max(i + 1);
            }
            _ => i += 1,
        }
    }
    out
}

/// The module a path names, as the file of its longest prefix that is one.
fn resolve(files: &BTreeMap<Module, Source>, from: &Module, path: &[String]) -> Option<Module> {
    let mut segs: Vec<String> = match path[0].as_str() {
        "crate" => vec![],
        "self" => from.clone(),
        _ => {
            let mut base = from.clone();
            let supers = path.iter().take_while(|s| *s == "super").count();
            for _ in 0..supers {
                base.pop();
            }
            base.extend(path[supers..].iter().cloned());
            return longest(files, &base);
        }
    };
    segs.extend(path[1..].iter().cloned());
    longest(files, &segs)
}

fn longest(files: &BTreeMap<Module, Source>, segs: &[String]) -> Option<Module> {
    (0..=segs.len()).rev().map(|k| segs[..k].to_vec()).find(|m| files.contains_key(m))
}

/// Imports between files: `from` → the files it names (not itself, not its own folder's files
/// when it is that folder's `mod.rs`).
fn file_edges(files: &BTreeMap<Module, Source>) -> BTreeMap<Module, BTreeSet<Module>> {
    let mut edges: BTreeMap<Module, BTreeSet<Module>> = BTreeMap::new();
    for (m, s) in files {
        if s.rel == "main.rs" {
            continue;
        }
        let set = edges.entry(m.clone()).or_default();
        for p in paths(&s.code) {
            let Some(t) = resolve(files, m, &p) else { continue };
            if t == *m || (t.len() > m.len() && t[..m.len()] == m[..]) || t.is_empty() {
                continue;
            }
            set.insert(t);
        }
    }
    edges
}

/// The strongly connected parts of more than one file (Tarjan).
fn cycles(edges: &BTreeMap<Module, BTreeSet<Module>>) -> Vec<Vec<Module>> {
    struct T<'a> {
        edges: &'a BTreeMap<Module, BTreeSet<Module>>,
        index: BTreeMap<Module, usize>,
        low: BTreeMap<Module, usize>,
        stack: Vec<Module>,
        on: BTreeSet<Module>,
        out: Vec<Vec<Module>>,
    }
    impl T<'_> {
        fn visit(&mut self, v: &Module) {
            let n = self.index.len();
            self.index.insert(v.clone(), n);
            self.low.insert(v.clone(), n);
            self.stack.push(v.clone());
            self.on.insert(v.clone());
            for w in self.edges.get(v).into_iter().flatten() {
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let l = self.low[w].min(self.low[v]);
                    self.low.insert(v.clone(), l);
                } else if self.on.contains(w) {
                    let l = self.index[w].min(self.low[v]);
                    self.low.insert(v.clone(), l);
                }
            }
            if self.low[v] == self.index[v] {
                let mut part = vec![];
                loop {
                    let w = self.stack.pop().unwrap();
                    self.on.remove(&w);
                    let done = w == *v;
                    part.push(w);
                    if done {
                        break;
                    }
                }
                if part.len() > 1 {
                    self.out.push(part);
                }
            }
        }
    }
    let mut t =
        T { edges, index: BTreeMap::new(), low: BTreeMap::new(), stack: vec![], on: BTreeSet::new(), out: vec![] };
    for v in edges.keys() {
        if !t.index.contains_key(v) {
            t.visit(v);
        }
    }
    t.out
}

/// The code map's "may import" column: each top-level module (`src/x.rs` or `src/x/`) and the
/// modules it may import (`everything`: all).
fn allowed(tops: &BTreeSet<String>) -> BTreeMap<String, BTreeSet<String>> {
    let doc = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("ARCHITECTURE.md")).unwrap();
    let map = doc.split("## Code map").nth(1).expect("ARCHITECTURE.md has a `## Code map` section");
    let mut out = BTreeMap::new();
    for line in map.lines().take_while(|l| !l.starts_with("##")) {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        if cells.len() < 5 || !cells[1].starts_with('`') {
            continue;
        }
        let ticked = |cell: &str| -> Vec<String> { cell.split('`').skip(1).step_by(2).map(str::to_string).collect() };
        let may: BTreeSet<String> = if cells[3].starts_with("everything") {
            tops.clone()
        } else {
            ticked(cells[3]).into_iter().filter(|m| tops.contains(m)).collect()
        };
        for path in ticked(cells[1]) {
            let Some(rest) = path.strip_prefix("src/") else { continue };
            let parts: Vec<&str> = rest.trim_end_matches('/').split('/').collect();
            // A folder's inner files (`src/http/mcp/`) are their module's.
            if parts.len() == 1 {
                out.insert(parts[0].trim_end_matches(".rs").to_string(), may.clone());
            }
        }
    }
    out
}

#[test]
fn every_import_is_one_the_architecture_allows_and_no_import_runs_in_a_circle() {
    let files = sources();
    assert!(files.len() > 50, "read {} files from {:?}", files.len(), src_root());
    let edges = file_edges(&files);
    // The reader finds what it should (a guard against a test that passes by reading nothing).
    let tasks_mod = vec!["tasks".to_string()];
    assert!(edges[&tasks_mod].contains(&vec!["hub".to_string()]), "{:?}", edges[&tasks_mod]);
    assert!(
        edges[&vec!["tasks".to_string(), "submit".to_string()]].contains(&tasks_mod),
        "a child's `use super::…` is read"
    );

    let circles: Vec<String> = cycles(&edges)
        .into_iter()
        .map(|c| c.iter().map(|m| files[m].rel.clone()).collect::<Vec<_>>().join(" ↔ "))
        .collect();
    assert!(circles.is_empty(), "import cycles between files: {circles:#?}");

    let tops: BTreeSet<String> = files.keys().filter_map(|m| m.first().cloned()).collect();
    let rules = allowed(&tops);
    let mut refused = vec![];
    for top in &tops {
        if top == "main" || top == "lib" {
            continue;
        }
        let Some(may) = rules.get(top) else {
            refused.push(format!("src/{top}: no row in ARCHITECTURE.md's code map"));
            continue;
        };
        for (from, to) in &edges {
            if from.first() != Some(top) {
                continue;
            }
            for t in to {
                let Some(other) = t.first().filter(|o| *o != top) else { continue };
                if !may.contains(other) {
                    refused.push(format!("{} imports `{other}` ({})", files[from].rel, files[t].rel));
                }
            }
        }
    }
    assert!(refused.is_empty(), "imports the code map does not allow: {refused:#?}");
}

#[test]
fn the_import_reader_sees_use_trees_super_and_inline_paths_but_not_comments_or_strings() {
    let code = strip(
        "use crate::{a::{b, c as d}, e};\nuse super::super::f::g;\n// crate::h\nlet x = \"crate::i\";\n\
         let y = crate::j::k(1);\n#[cfg(test)]\nmod tests { use crate::l; }\n",
    );
    let got: Vec<String> = paths(&code).into_iter().map(|p| p.join("::")).collect();
    assert_eq!(got, ["crate::a::b", "crate::a::c", "crate::e", "super::super::f::g", "crate::j::k"]);
    // A cycle of two files is found; a chain is not one.
    let m = |s: &str| vec![s.to_string()];
    let mut edges = BTreeMap::new();
    edges.insert(m("a"), BTreeSet::from([m("b")]));
    edges.insert(m("b"), BTreeSet::from([m("c")]));
    edges.insert(m("c"), BTreeSet::new());
    assert!(cycles(&edges).is_empty());
    edges.insert(m("c"), BTreeSet::from([m("a")]));
    assert_eq!(cycles(&edges).len(), 1);
}

#[test]
fn no_function_in_src_is_over_120_lines() {
    let mut long = vec![];
    for s in sources().values() {
        let raw = std::fs::read_to_string(src_root().join(&s.rel)).unwrap();
        let lines: Vec<&str> = raw.lines().collect();
        for (i, l) in lines.iter().enumerate() {
            let t = l.trim_start();
            let indent = &l[..l.len() - t.len()];
            let is_fn = ["fn ", "pub fn ", "async fn ", "pub async fn ", "pub(crate) fn ", "pub(crate) async fn "]
                .iter()
                .any(|p| t.starts_with(p))
                || (t.starts_with("pub(") && t.contains(") fn ") || t.contains(") async fn "));
            if !is_fn || t.ends_with(';') {
                continue;
            }
            let close = format!("{indent}}}");
            if let Some(end) = lines[i + 1..].iter().position(|x| *x == close || x.starts_with(&format!("{close} "))) {
                if end + 2 > 120 {
                    long.push(format!("{}:{}: {} lines", s.rel, i + 1, end + 2));
                }
            }
        }
    }
    assert!(long.is_empty(), "functions over 120 lines (fn line to closing brace): {long:#?}");
}

/// SQL the compiler does not check (#66): every static statement is a sqlx macro; the calls that
/// take SQL made at run time (`sqlx::query(`, `query_as(`, `query_scalar(`, `QueryBuilder`,
/// counted as these strings occur, comments aside) are at most 15, only where SQL may live, and
/// each has, in the comment above it, the test that runs its shapes against the real schema
/// (`module::test`, a test that exists).
#[test]
fn runtime_sql_is_rare_kept_in_the_store_and_each_names_the_test_of_its_shapes() {
    const CALLS: [&str; 4] = ["sqlx::query(", "query_as(", "query_scalar(", "QueryBuilder"];
    let tests_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/api");
    let test_exists = |path: &str| {
        let Some((module, name)) = path.split_once("::") else { return false };
        std::fs::read_to_string(tests_dir.join(format!("{module}.rs")))
            .is_ok_and(|src| src.contains(&format!("fn {name}(")))
    };
    let mut found = vec![];
    for s in sources().values() {
        let raw = std::fs::read_to_string(src_root().join(&s.rel)).unwrap();
        let lines: Vec<&str> = raw.lines().collect();
        for (i, l) in lines.iter().enumerate() {
            let code = l.split("//").next().unwrap_or("");
            let n: usize = CALLS.iter().map(|c| code.matches(c).count()).sum();
            if n == 0 {
                continue;
            }
            let rel = s.rel.to_string();
            let place_ok = rel.starts_with("store/") || rel.starts_with("db/") || rel == "hub.rs" || rel == "live.rs";
            assert!(place_ok, "src/{rel}:{}: SQL outside src/store, src/db and the notifications", i + 1);
            // The comments above the call (its function's, or the lines just before it).
            let above: String = lines[i.saturating_sub(40)..i]
                .iter()
                .filter_map(|l| l.trim_start().strip_prefix("//"))
                .collect::<Vec<_>>()
                .join(" ");
            let named: Vec<&str> = above
                .split('`')
                .skip(1)
                .step_by(2)
                .filter(|p| p.contains("::") && !p.contains('(') && !p.contains(' '))
                .collect();
            assert!(
                named.iter().any(|p| test_exists(p)),
                "src/{rel}:{}: a runtime query whose comment names no existing test of its shapes (named: {named:?})",
                i + 1
            );
            found.push((format!("src/{rel}:{}", i + 1), n));
        }
    }
    let total: usize = found.iter().map(|f| f.1).sum();
    assert!(total <= 15, "{total} runtime query calls (at most 15): {found:#?}");
    assert!(total > 0, "the count found nothing: the reader is broken");
}
