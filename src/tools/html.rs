//! A fetched HTML page as readable text, in time linear in its size whatever it holds.
//!
//! html2text (over html5ever's tree builder) does the conversion. Both take time quadratic in
//! the nesting depth: the tree builder checks the stack of open elements for each block start
//! tag, and the renderer recurses over the tree. A hostile page of 100,000 nested `<div>`s took
//! 82 s of CPU. So the page first goes through html5ever's tokenizer (linear), which re-writes it
//! with elements nested deeper than `MAX_DEPTH` unwrapped (their text kept), and scripts and
//! styles, which are never shown, dropped.

use std::cell::RefCell;

use html5ever::tendril::StrTendril;
use html5ever::tokenizer::states::RawKind;
use html5ever::tokenizer::{BufferQueue, TagKind, Token, TokenSink, TokenSinkResult, Tokenizer};

/// The deepest element nesting kept; deeper elements are unwrapped (pages people read stay far
/// below it).
pub const MAX_DEPTH: usize = 64;

/// Elements with no content, and those whose end tag may be left out (they close themselves
/// when the next one starts): not counted as nesting, or a page of unclosed `<p>`s would seem
/// deep.
const UNCOUNTED: &[&str] = &[
    "area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr", "p", "li",
    "dt", "dd", "tr", "td", "th", "thead", "tbody", "tfoot", "option", "optgroup", "rb", "rt", "rp", "colgroup",
    "caption", "html", "head", "body",
];

/// What is never shown, content and all (the tokenizer reads their content as raw text).
const DROPPED: &[&str] = &["script", "style", "template", "noscript", "iframe", "noembed", "noframes", "xmp"];

#[derive(Default)]
struct State {
    out: String,
    /// Characters of text seen, and how many may be written before the rest is only counted.
    text: usize,
    budget: usize,
    /// Counted elements open, and how many of them were dropped for being too deep.
    depth: usize,
    unwrapped: usize,
    /// Inside a dropped element: its name.
    skipping: Option<String>,
}

struct Limiter(RefCell<State>);

fn escape_text(out: &mut String, s: &str) {
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            c => out.push(c),
        }
    }
}

impl TokenSink for Limiter {
    type Handle = ();

    fn process_token(&self, token: Token, _line: u64) -> TokenSinkResult<()> {
        let mut st = self.0.borrow_mut();
        let st = &mut *st;
        match token {
            Token::TagToken(tag) => {
                let name: &str = &tag.name;
                if let Some(skip) = &st.skipping {
                    if tag.kind == TagKind::EndTag && skip == name {
                        st.skipping = None;
                    }
                    return TokenSinkResult::Continue;
                }
                if tag.kind == TagKind::StartTag && DROPPED.contains(&name) {
                    if !tag.self_closing {
                        st.skipping = Some(name.to_string());
                        return TokenSinkResult::RawData(if name == "script" {
                            RawKind::ScriptData
                        } else {
                            RawKind::Rawtext
                        });
                    }
                    return TokenSinkResult::Continue;
                }
                let counted = !UNCOUNTED.contains(&name);
                let emit = match (tag.kind, counted) {
                    (_, false) => true,
                    (TagKind::StartTag, true) if tag.self_closing => st.depth < MAX_DEPTH,
                    (TagKind::StartTag, true) if st.depth >= MAX_DEPTH => {
                        st.unwrapped += 1;
                        false
                    }
                    (TagKind::StartTag, true) => {
                        st.depth += 1;
                        true
                    }
                    (TagKind::EndTag, true) if st.unwrapped > 0 => {
                        st.unwrapped -= 1;
                        false
                    }
                    (TagKind::EndTag, true) => {
                        st.depth = st.depth.saturating_sub(1);
                        true
                    }
                };
                if emit && st.text < st.budget {
                    let out = &mut st.out;
                    out.push('<');
                    if tag.kind == TagKind::EndTag {
                        out.push('/');
                    }
                    out.push_str(name);
                    if tag.kind == TagKind::StartTag {
                        for a in &tag.attrs {
                            out.push(' ');
                            out.push_str(&a.name.local);
                            out.push_str("=\"");
                            for c in a.value.chars() {
                                match c {
                                    '&' => out.push_str("&amp;"),
                                    '"' => out.push_str("&quot;"),
                                    c => out.push(c),
                                }
                            }
                            out.push('"');
                        }
                        if tag.self_closing {
                            out.push_str(" /");
                        }
                    }
                    out.push('>');
                }
                // The tokenizer's own state for elements whose content is text.
                if tag.kind == TagKind::StartTag && !tag.self_closing && matches!(name, "title" | "textarea") {
                    return TokenSinkResult::RawData(RawKind::Rcdata);
                }
            }
            Token::CharacterTokens(s) if st.skipping.is_none() => {
                let n = s.chars().count();
                if st.text < st.budget {
                    escape_text(&mut st.out, &s);
                }
                st.text += n;
            }
            Token::DoctypeToken(_) if st.out.is_empty() => st.out.push_str("<!doctype html>"),
            _ => {}
        }
        TokenSinkResult::Continue
    }
}

/// `html` re-written with nesting past `MAX_DEPTH` unwrapped and what is never shown dropped,
/// and only up to its first `budget` characters of text (the rest is counted, not written);
/// with the number of characters of text the whole page holds.
pub fn limit_nesting(html: &str, budget: usize) -> (String, usize) {
    let state =
        State { out: String::with_capacity(html.len().min(budget.saturating_mul(4))), budget, ..State::default() };
    let input = BufferQueue::default();
    input.push_back(StrTendril::from_slice(html));
    let tok = Tokenizer::new(Limiter(RefCell::new(state)), Default::default());
    let _ = tok.feed(&input);
    tok.end();
    let mut st = tok.sink.0.borrow_mut();
    (std::mem::take(&mut st.out), st.text)
}

/// A page made text.
pub struct PageText {
    pub text: String,
    /// Characters of text the whole page holds (before it was cut to the budget), about.
    pub total_chars: usize,
    /// Only the page's beginning was made text.
    pub cut: bool,
}

/// HTML as readable text: headings, paragraphs, lists, tables and links (as numbered
/// references) kept; scripts, styles and navigation chrome dropped. Only the page's first
/// `budget` characters of text are rendered: a 1 MB page's text is cut to the tool-result cap
/// anyway, and rendering takes time in what it renders.
pub fn to_text(html: &[u8], budget: usize) -> Result<PageText, String> {
    const CHROME: &str = "script, style, noscript, template, nav, header, footer, aside, form, svg, iframe, \
                          button, select { display: none; }";
    let (limited, total_chars) = limit_nesting(&String::from_utf8_lossy(html), budget);
    let text = html2text::config::plain()
        .add_css(CHROME)
        .map_err(|e| e.to_string())?
        .no_table_borders()
        .string_from_read(limited.as_bytes(), 100)
        .map_err(|e| e.to_string())?;
    Ok(PageText { text, total_chars, cut: total_chars > budget })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_keep_their_structure_and_lose_scripts() {
        let page = r#"<!doctype html><html><head><title>A &amp; B</title><script>if (a < b) { x = "</div>"; }</script>
            <style>p { color: red }</style></head><body><h1 id="t">Title</h1>
            <p>One <a href="https://e.org/?a=1&amp;b=&quot;2&quot;">link</a> &lt;tag&gt;<p>Two<br/>
            <ul><li>a<li>b</ul></body></html>"#;
        let (out, _) = limit_nesting(page, usize::MAX);
        assert!(!out.contains("x =") && !out.contains("color: red"), "{out}");
        assert!(out.contains(r#"<a href="https://e.org/?a=1&amp;b=&quot;2&quot;">link</a>"#), "{out}");
        assert!(out.contains("&lt;tag&gt;") && out.contains("<title>A &amp; B</title>"), "{out}");
        let text = to_text(page.as_bytes(), usize::MAX).unwrap().text;
        assert!(text.contains("Title") && text.contains("link") && text.contains("<tag>"), "{text}");
        assert!(text.contains("https://e.org/?a=1&b=\"2\""), "{text}");
    }

    #[test]
    fn deep_nesting_is_unwrapped_and_its_text_kept() {
        let page = format!("{}deep text{}", "<div>".repeat(100_000), "</div>".repeat(100_000));
        let (out, _) = limit_nesting(&page, usize::MAX);
        assert_eq!(out.matches("<div>").count(), MAX_DEPTH);
        assert_eq!(out.matches("</div>").count(), MAX_DEPTH);
        assert!(out.contains("deep text"));
        let unclosed = format!("{}x", "<b>".repeat(100_000));
        assert_eq!(limit_nesting(&unclosed, usize::MAX).0.matches("<b>").count(), MAX_DEPTH);
        let paragraphs = "<p>x".repeat(1000);
        assert_eq!(
            limit_nesting(&paragraphs, usize::MAX).0.matches("<p>").count(),
            1000,
            "optional end tags are not depth"
        );
    }

    #[test]
    fn only_the_text_budget_is_written_and_the_rest_is_counted() {
        let page = "<p>0123456789</p>".repeat(100);
        let (out, total) = limit_nesting(&page, 25);
        assert_eq!(total, 1000);
        assert_eq!(out.matches("0123456789").count(), 3, "{out}");
        let t = to_text(page.as_bytes(), 25).unwrap();
        assert!(t.cut && t.total_chars == 1000 && t.text.matches("0123456789").count() == 3, "{}", t.text);
    }
}

#[cfg(test)]
mod timing {
    #[test]
    #[ignore = "timings: cargo test --release --lib -- --ignored html_timings --nocapture"]
    fn html_timings() {
        let mut s = String::from("<html><body><nav><a href=\"/\">Home</a></nav>");
        let mut i = 0;
        while s.len() < 1024 * 1024 {
            s.push_str(&format!(
                "<h2>Section {i}</h2><p>Paragraph {i} of the article, with <a href=\"https://example.org/{i}\">a link</a> \
                 and enough words to read like prose about tides, moons and harbours.</p>\
                 <ul><li>point one of {i}</li><li>point two of {i}</li></ul>\
                 <table><tr><th>Port</th><th>Range</th></tr><tr><td>P{i}</td><td>{i} m</td></tr></table>"
            ));
            i += 1;
        }
        let t = std::time::Instant::now();
        let (limited, _) = super::limit_nesting(&s, usize::MAX);
        println!("limit: {:?}", t.elapsed());
        let t = std::time::Instant::now();
        let _ = html2text::config::plain().parse_html(limited.as_bytes()).unwrap();
        println!("parse: {:?}", t.elapsed());
        let t = std::time::Instant::now();
        let _ = html2text::config::plain().string_from_read(limited.as_bytes(), 100).unwrap();
        println!("plain, no css: {:?}", t.elapsed());
        let t = std::time::Instant::now();
        let out = super::to_text(s.as_bytes(), usize::MAX).unwrap();
        println!("to_text: {:?}, {} chars", t.elapsed(), out.text.len());
        let t = std::time::Instant::now();
        let out = super::to_text(s.as_bytes(), 128 * 1024).unwrap();
        println!("to_text, 128K budget: {:?}, {} chars", t.elapsed(), out.text.len());
    }
}
