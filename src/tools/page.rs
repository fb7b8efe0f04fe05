//! A fetched HTML page as Markdown an LLM reads well: the page's main content (a
//! readability.js-style pass, `dom_smoothie`) converted by `htmd`, with code blocks fenced and
//! named by language, tables as pipe tables with whole cells, links made absolute against the
//! page's final URL, and chrome (navigation, sidebars, keyboard help, theme menus, cookie
//! banners, forms) dropped.
//!
//! The page first goes through `html::limit_nesting` (linear in its size): elements nested deeper
//! than `html::MAX_DEPTH` are unwrapped, scripts and styles dropped, and only the first `budget`
//! characters of text written, so that the parsers after it, whose time grows with nesting, get
//! a bounded page.

use dom_query::{Document, Selection};

use super::html::{limit_nesting, PageText};

/// What is never the content: navigation, sidebars, menus and dialogs, forms, cookie banners,
/// mdBook's keyboard help and theme menu, Sphinx's and rustdoc's chrome, screen-reader skips.
const CHROME: &str = "nav, aside, form, button, select, dialog, svg, iframe, object, embed, canvas, \
    [role=navigation], [role=banner], [role=search], [role=contentinfo], [role=dialog], [aria-hidden=true], \
    [hidden], .sidebar, #sidebar, .sphinxsidebar, .related, .headerlink, .anchor, .navheader, .navfooter, \
    #mdbook-help-container, #mdbook-menu-bar, #menu-bar, .theme-popup, #theme-list, .nav-chapters, .nav-wrapper, \
    rustdoc-toolbar, .out-of-band, .src, .srclink, .test-arrow, .rustdoc-breadcrumbs, \
    .navbox, .vertical-navbox, .mw-editsection, .mw-jump-link, #toc, .toc, \
    [id*=cookie], [class*=cookie], [id*=consent], [class*=consent], .skip-link, .visually-hidden, .sr-only";

/// The language a code block names: a `language-x` or `lang-x` class on the `pre` or inside it
/// (mdBook nests a `pre` and a `code` in it), a Sphinx `highlight-x` on an ancestor, or
/// rustdoc's `rust` class.
fn language(pre: &Selection) -> Option<String> {
    let from = |class: &str| {
        class.split_ascii_whitespace().find_map(|c| {
            c.strip_prefix("language-")
                .or_else(|| c.strip_prefix("lang-"))
                .or_else(|| c.strip_prefix("highlight-").filter(|l| *l != "default"))
                .or((c == "rust").then_some("rust"))
                .map(str::to_string)
        })
    };
    let inside = pre
        .attr("class")
        .and_then(|c| from(&c))
        .or_else(|| pre.select("[class]").iter().find_map(|n| n.attr("class").and_then(|c| from(&c))));
    inside
        .or_else(|| pre.ancestors(Some(3)).iter().find_map(|a| a.attr("class").and_then(|c| from(&c))))
        .map(|l| l.trim_end_matches(|c: char| c.is_ascii_digit()).to_string())
        .filter(|l| !l.is_empty() && l.chars().all(|c| c.is_ascii_alphanumeric() || "+-_#".contains(c)))
}

/// The characters a table may make at most as a pipe table (see `normalize`).
const MAX_TABLE: usize = 1 << 20;

/// Is `url` absolute, of a scheme shown to the model (http, https, and for links mailto)?
fn shown_scheme(url: &str, link: bool) -> bool {
    reqwest::Url::parse(url).is_ok_and(|u| matches!(u.scheme(), "http" | "https") || (link && u.scheme() == "mailto"))
}

fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    super::html::escape_text(&mut out, s);
    out
}

/// Make the document's structure what the converter reads well: every `pre` a single `code` of
/// its text (so links and markup inside a code block do not become Markdown, and a `pre` without
/// `code` is fenced too), named by its language; a table with no header cell gets its first row
/// as its header (a pipe table needs one) unless it holds a table or has one column; chrome gone;
/// links and images absolute against `base`.
fn normalize(doc: &Document, base: Option<&reqwest::Url>) {
    doc.select(CHROME).remove();
    // A page's footer is never its content; a header is chrome unless it holds a heading (an
    // article's header does).
    doc.select("footer").remove();
    for h in doc.select("header").iter() {
        if !h.select("h1, h2, h3").exists() {
            h.remove();
        }
    }
    // Outermost `pre`s only (mdBook nests them).
    for pre in doc.select("pre").iter().filter(|p| !p.ancestors(None).is("pre")) {
        let lang = language(&pre);
        let text = pre.text();
        let class = lang.map(|l| format!(" class=\"language-{l}\"")).unwrap_or_default();
        pre.set_html(format!("<code{class}>{}</code>", escape(&text)));
    }
    // A line break in a cell would end the table's row: a separator instead.
    doc.select("td br, th br").replace_with_html("; ");
    for table in doc.select("table").iter() {
        // A pipe table pads each row to its columns' widths (and records repeat the header in
        // each row): where rows × width would make more than `MAX_TABLE` characters, the table
        // is read as its text, block by block.
        let rows = table.select("tr");
        let mut widths: Vec<usize> = vec![];
        for r in rows.iter() {
            for (i, c) in r.select("td, th").iter().enumerate() {
                let n = c.text().len();
                match widths.get_mut(i) {
                    Some(w) => *w = (*w).max(n),
                    None => widths.push(n),
                }
            }
        }
        if rows.length().saturating_mul(widths.iter().sum::<usize>() + 4 * widths.len()) > MAX_TABLE {
            table.select("thead, tbody, tfoot, tr, td, th, caption").rename("div");
            table.rename("div");
            continue;
        }
        if table.select("table").exists() || table.select("th").exists() {
            continue;
        }
        let rows = table.select("tr");
        let first = rows.first();
        if rows.length() >= 2 && first.select("td").length() >= 2 {
            first.select("td").rename("th");
        }
    }
    if let Some(base) = base {
        let base = doc
            .select_single("base[href]")
            .attr("href")
            .and_then(|h| base.join(&h).ok())
            .unwrap_or_else(|| base.clone());
        for (sel, attr) in [("a[href]", "href"), ("img[src]", "src")] {
            for n in doc.select(sel).nodes() {
                if let Some(abs) = n.attr(attr).and_then(|v| base.join(v.trim()).ok()) {
                    n.set_attr(attr, abs.as_str());
                }
            }
        }
    }
    // Only web and mail addresses are shown: a `javascript:` or `data:` link keeps its text and
    // loses its target; an image of another scheme (a `data:` one can be megabytes) is its alt.
    for n in doc.select("a[href]").nodes() {
        if !n.attr("href").is_some_and(|h| shown_scheme(&h, true)) {
            n.remove_attr("href");
        }
    }
    for n in doc.select("img").nodes() {
        if !n.attr("src").is_some_and(|h| shown_scheme(&h, false)) {
            let alt = n.attr("alt").map(|a| escape(&a)).unwrap_or_default();
            n.replace_with_html(alt);
        }
    }
}

/// The most columns a pipe table keeps; a wider one is written as a list of records, each row a
/// line of `**header**: value` pairs, which reads whole where a wide row would wrap past reading.
const MAX_COLUMNS: usize = 8;

/// Pipe tables without the converter's padding (cells padded to their column's widest, which
/// can be hundreds of spaces a row): each cell's text trimmed, each separator `---`; a table of
/// more than `MAX_COLUMNS` columns as records. Lines in fenced code are left as they are.
fn tidy_tables(md: &str) -> String {
    let mut out = String::with_capacity(md.len());
    let mut fence: Option<(char, usize)> = None;
    // The table being read: its lines' prefix (a blockquote's `> `) and its rows' cells.
    let mut table: Option<(&str, Vec<Vec<&str>>)> = None;
    for line in md.lines() {
        let body = line.trim_start_matches(['>', ' ']);
        let prefix = &line[..line.len() - body.len()];
        let row = body.trim_end();
        if fence.is_none() && row.len() > 1 && row.starts_with('|') && row.ends_with('|') {
            let cells = cells(&row[1..row.len() - 1]);
            match &mut table {
                Some((p, rows)) if *p == prefix => rows.push(cells),
                _ => {
                    if let Some((p, rows)) = table.take() {
                        write_table(&mut out, p, &rows);
                    }
                    table = Some((prefix, vec![cells]));
                }
            }
            continue;
        }
        if let Some((p, rows)) = table.take() {
            write_table(&mut out, p, &rows);
        }
        // A fence is closed by a run of its character at least as long as the one that opened it.
        let run = |ch: char| body.len() - body.trim_start_matches(ch).len();
        if let Some((ch, n)) = fence {
            if run(ch) >= n && body.trim_start_matches(ch).trim().is_empty() {
                fence = None;
            }
        } else if run('`') >= 3 {
            fence = Some(('`', run('`')));
        } else if run('~') >= 3 {
            fence = Some(('~', run('~')));
        }
        out.push_str(line);
        out.push('\n');
    }
    if let Some((p, rows)) = table.take() {
        write_table(&mut out, p, &rows);
    }
    out
}

/// One table's rows, as a pipe table or (past `MAX_COLUMNS`, with a header) as records.
fn write_table(out: &mut String, prefix: &str, rows: &[Vec<&str>]) {
    let is_sep = |r: &[&str]| r.iter().all(|c| !c.is_empty() && c.chars().all(|ch| ch == '-' || ch == ':'));
    let wide = rows.len() >= 2 && is_sep(&rows[1]) && rows[0].len() > MAX_COLUMNS;
    if wide {
        let header = &rows[0];
        for r in &rows[2..] {
            let pairs: Vec<String> = r
                .iter()
                .enumerate()
                .filter(|(_, v)| !v.is_empty())
                .map(|(i, v)| match header.get(i).filter(|h| !h.is_empty()) {
                    Some(h) => format!("**{h}**: {v}"),
                    None => v.to_string(),
                })
                .collect();
            out.push_str(prefix);
            out.push_str("- ");
            out.push_str(&pairs.join("; "));
            out.push('\n');
        }
        return;
    }
    for r in rows {
        let sep = is_sep(r);
        out.push_str(prefix);
        out.push('|');
        for c in r {
            out.push(' ');
            if sep || !c.is_empty() {
                out.push_str(if sep { "---" } else { c });
                out.push(' ');
            }
            out.push('|');
        }
        out.push('\n');
    }
}

/// A table row's cells: split at each `|` that is not escaped (`\|` is a pipe in a cell), trimmed.
fn cells(row: &str) -> Vec<&str> {
    let (mut out, mut start, mut escaped) = (vec![], 0, false);
    for (i, c) in row.char_indices() {
        match c {
            '\\' => escaped = !escaped,
            '|' if !escaped => {
                out.push(row[start..i].trim());
                start = i + 1;
            }
            _ => escaped = false,
        }
    }
    out.push(row[start..].trim());
    out
}

/// HTML as Markdown (see the module's doc). Only the page's first `budget` characters of text are
/// converted: a 1 MB page's text is cut to the tool-result cap anyway.
pub fn to_markdown(html: &[u8], url: &str, budget: usize) -> Result<PageText, String> {
    let (limited, total_chars) = limit_nesting(&String::from_utf8_lossy(html), budget);
    let base = reqwest::Url::parse(url).ok();
    let prepared = || {
        let doc = Document::from(limited.as_str());
        normalize(&doc, base.as_ref());
        doc
    };
    let doc = prepared();
    let page_text = doc.select("body").text().split_whitespace().map(str::len).sum::<usize>();
    let title = doc.select_single("title").text().trim().to_string();
    // The main content, where readability finds one that holds most of the page's text (an API
    // reference or a table of many rows is all content: there it would keep too little).
    let cfg = dom_smoothie::Config { keep_classes: true, ..Default::default() };
    let main = dom_smoothie::Readability::with_document(doc, base.as_ref().map(|u| u.as_str()), Some(cfg))
        .ok()
        .and_then(|mut r| r.parse_with_policy(dom_smoothie::ParsePolicy::Moderate).ok())
        .filter(|a| a.text_content.split_whitespace().map(str::len).sum::<usize>() * 2 >= page_text)
        .map(|a| a.content.to_string());
    let converter = htmd::HtmlToMarkdown::builder()
        .options(htmd::options::Options {
            bullet_list_marker: htmd::options::BulletListMarker::Dash,
            ul_bullet_spacing: 1,
            ol_number_spacing: 1,
            ..Default::default()
        })
        // The title is written apart; scripts, styles and chrome are gone already.
        .skip_tags(vec!["head"])
        .build();
    // Where readability kept too little, the whole page (made again: readability took the first).
    let body = main.unwrap_or_else(|| prepared().select("body").inner_html().to_string());
    let mut text = tidy_tables(&converter.convert(&body).map_err(|e| e.to_string())?);
    if !title.is_empty() && !text.trim_start().starts_with('#') {
        text = format!("# {title}\n\n{text}");
    }
    Ok(PageText { text, total_chars, cut: total_chars > budget })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> String {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/pages");
        let pages: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("pages.json")).unwrap()).unwrap();
        let url =
            pages.as_array().unwrap().iter().find(|p| p["file"] == name).unwrap()["url"].as_str().unwrap().to_string();
        let html = std::fs::read(dir.join(name)).unwrap();
        to_markdown(&html, &url, usize::MAX).unwrap().text
    }

    /// The fenced blocks of `md` (inside blockquotes too): (language, body).
    fn fences(md: &str) -> Vec<(String, String)> {
        type Block = (String, String);
        let (mut out, mut open): (Vec<Block>, Option<Block>) = (vec![], None);
        for line in md.lines() {
            let body = line.trim_start_matches(['>', ' ']);
            match (&mut open, body.strip_prefix("```")) {
                (None, Some(lang)) => open = Some((lang.trim().to_string(), String::new())),
                (Some(_), Some("")) => out.extend(open.take()),
                (Some((_, b)), _) => {
                    b.push_str(body);
                    b.push('\n');
                }
                (None, None) => {}
            }
        }
        out
    }

    /// Every inline link's target in `md` (outside code).
    fn targets(md: &str) -> Vec<String> {
        let mut out = vec![];
        let prose: String = md.split("```").step_by(2).collect();
        let mut rest = prose.as_str();
        while let Some(i) = rest.find("](") {
            rest = &rest[i + 2..];
            let end = rest.find([')', ' ']).unwrap_or(rest.len());
            out.push(rest[..end].to_string());
        }
        out
    }

    #[test]
    fn code_blocks_come_fenced_with_their_language_and_their_text_alone() {
        // (page, its `pre`s, a language it names, how many blocks name it)
        for (name, pres, lang, named) in [
            ("rust-book-strings.html", 25, "rust", 18),
            ("nodejs-http.html", 74, "js", 44),
            ("python-stdtypes.html", 131, "python", 100),
            ("rust-std-vec.html", 219, "rust", 200),
            ("postgres-datetime.html", 39, "", 39),
            ("git-rebase.html", 40, "", 40),
        ] {
            let md = fixture(name);
            let f = fences(&md);
            assert!(f.len() * 100 >= pres * 97, "{name}: {} fenced blocks of {pres}", f.len());
            let n = f.iter().filter(|(l, _)| l == lang).count();
            assert!(n >= named, "{name}: {n} of {} fenced as {lang:?}", f.len());
            // Links and markup inside code stay code (rustdoc links its types in examples).
            for (_, body) in &f {
                assert!(!body.contains("](https://"), "{name}: a link in a code block: {body}");
            }
        }
        let book = fences(&fixture("rust-book-strings.html"));
        assert!(book.iter().any(|(_, b)| b.contains("let mut s = String::new();")), "{book:?}");
    }

    #[test]
    fn tables_come_as_pipe_tables_with_whole_cells_and_without_padding() {
        let py = fixture("python-stdtypes.html");
        assert!(
            py.contains("\n| `x or y` | if *x* is false, then *y*, else *x* | (1) |\n"),
            "a row of its first table"
        );
        let sqlite = fixture("sqlite-datatypes.html");
        assert!(
            sqlite.contains(
                "| INT; INTEGER; TINYINT; SMALLINT; MEDIUMINT; BIGINT; UNSIGNED BIG INT; INT2; INT8 | INTEGER | 1 |"
            ),
            "a cell's line breaks are separators, its words whole"
        );
        let node = fixture("nodejs-http.html");
        assert!(node.matches("| Version | Changes |\n| --- | --- |").count() >= 25, "the history tables");
        for md in [&py, &sqlite, &node, &fixture("postgres-datetime.html")] {
            assert!(!md.lines().any(|l| l.starts_with('|') && l.contains("  |")), "no padded cells");
        }
    }

    #[test]
    fn links_are_absolute_against_the_pages_url() {
        for name in ["rust-std-vec.html", "git-rebase.html", "python-stdtypes.html", "wikipedia-tsne.html"] {
            let md = fixture(name);
            let t = targets(&md);
            assert!(t.len() > 5, "{name}");
            let relative: Vec<&String> = t
                .iter()
                .filter(|u| !u.starts_with("https://") && !u.starts_with("http://") && !u.starts_with("mailto:"))
                .collect();
            assert!(relative.is_empty(), "{name}: {relative:?}");
        }
        // `../primitive.slice.html` from /1.63.0/std/vec/struct.Vec.html; a fragment keeps the page.
        let vec = fixture("rust-std-vec.html");
        assert!(vec.contains("(https://doc.rust-lang.org/1.63.0/std/primitive.slice.html"), "resolved from the page");
        assert!(vec.contains("(https://doc.rust-lang.org/1.63.0/std/vec/struct.Vec.html#method.with_capacity)"));
        assert!(fixture("git-rebase.html")
            .contains("(https://mirrors.edge.kernel.org/pub/software/scm/git/docs/git-config.html)"));
    }

    #[test]
    fn a_table_too_wide_reads_as_records_and_a_nested_one_as_text() {
        let head: String = (1..=10).map(|i| format!("<th>c{i}</th>")).collect();
        let row: String = (1..=10).map(|i| format!("<td>v{i}</td>")).collect();
        let html = format!(
            "<h1>T</h1><p>Wide:</p><table><tr>{head}</tr><tr>{row}</tr></table>\
             <table><tr><th>a</th><th>b</th></tr><tr><td>1</td><td>2</td></tr></table>\
             <table><tr><td><table><tr><td>inner</td><td>cell</td></tr></table></td><td>outer</td></tr></table>"
        );
        let md = to_markdown(html.as_bytes(), "https://e.org/", usize::MAX).unwrap().text;
        assert!(md.contains("- **c1**: v1; **c2**: v2;") && md.contains("**c10**: v10\n"), "{md}");
        assert!(md.contains("| a | b |\n| --- | --- |\n| 1 | 2 |"), "a narrow one stays a pipe table: {md}");
        assert!(md.contains("inner") && md.contains("outer") && !md.contains("| inner"), "{md}");
    }

    #[test]
    fn hostile_tables_links_and_images_are_bounded() {
        // A header 100,000 characters wide over 30,000 rows: as a pipe table, 3 GB of padding.
        let html =
            format!("<table><tr><th>{}</th></tr>{}</table>", "A".repeat(100_000), "<tr><td>x</td></tr>".repeat(30_000));
        let md = to_markdown(html.as_bytes(), "https://e.org/", 1 << 20).unwrap().text;
        assert!(md.len() < 400_000, "{} bytes", md.len());
        // Other schemes: the text without the target, the image as its alt.
        let html = format!(
            "<p><a href=\"javascript:alert(1)\">click</a> <a href=\"data:text/html,x\">d</a> \
             <img alt=\"a plot\" src=\"data:image/png;base64,{}\"> <a href=\"/ok\">ok</a></p>",
            "A".repeat(80_000)
        );
        let md = to_markdown(html.as_bytes(), "https://e.org/x/", usize::MAX).unwrap().text;
        assert!(!md.contains("javascript:") && !md.contains("data:"), "{md}");
        assert!(md.contains("click") && md.contains("a plot") && md.contains("[ok](https://e.org/ok)"), "{md}");
        assert!(md.len() < 200, "{md}");
    }

    #[test]
    fn a_longer_fence_holds_a_shorter_one_and_the_rows_in_it_are_left_alone() {
        let md = "````\n```\n|  a  |  b  |\n````\n|  c  |  d  |\n|---|---|\n";
        assert_eq!(tidy_tables(md), "````\n```\n|  a  |  b  |\n````\n| c | d |\n| --- | --- |\n");
    }

    #[test]
    fn chrome_is_dropped() {
        for (name, chrome) in [
            ("rust-book-strings.html", &["Keyboard shortcuts", "Navy", "Coal", "Print this book"][..]),
            ("python-stdtypes.html", &["Quick search", "Previous topic", "Show Source", "Report a Bug"]),
            ("wikipedia-tsne.html", &["Jump to navigation", "Jump to search", "Edit links", "Random article"]),
            ("wikipedia-new-zealand.html", &["Jump to navigation", "Print/export", "Main page"]),
            ("nodejs-http.html", &["Table of contents", "Edit on GitHub", "View another version"]),
            ("rust-std-vec.html", &["[Run](", "[source]("]),
        ] {
            let md = fixture(name);
            for c in chrome {
                assert!(!md.contains(c), "{name}: {c:?} is left");
            }
        }
    }

    /// Writes each fixture's Markdown beside it (`<name>.subagentd.md`), for `benches/pages.py`.
    #[test]
    #[ignore = "writes files: run by hand to refresh the side-by-side table"]
    fn write_the_fixtures_markdown() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/pages");
        let pages: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("pages.json")).unwrap()).unwrap();
        for p in pages.as_array().unwrap() {
            let file = p["file"].as_str().unwrap();
            let html = std::fs::read(dir.join(file)).unwrap();
            let t = std::time::Instant::now();
            let md = to_markdown(&html, p["url"].as_str().unwrap(), usize::MAX).unwrap();
            eprintln!("{file}: {} chars in {:?}", md.text.chars().count(), t.elapsed());
            std::fs::write(dir.join(file.replace(".html", ".subagentd.md")), md.text + "\n").unwrap();
        }
    }
}
