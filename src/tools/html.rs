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
                if emit {
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
            Token::CharacterTokens(s) if st.skipping.is_none() => escape_text(&mut st.out, &s),
            Token::DoctypeToken(_) if st.out.is_empty() => st.out.push_str("<!doctype html>"),
            _ => {}
        }
        TokenSinkResult::Continue
    }
}

/// `html` re-written with nesting past `MAX_DEPTH` unwrapped and what is never shown dropped.
pub fn limit_nesting(html: &str) -> String {
    let sink = Limiter(RefCell::new(State { out: String::with_capacity(html.len()), ..State::default() }));
    let input = BufferQueue::default();
    input.push_back(StrTendril::from_slice(html));
    let tok = Tokenizer::new(sink, Default::default());
    let _ = tok.feed(&input);
    tok.end();
    let out = std::mem::take(&mut tok.sink.0.borrow_mut().out);
    out
}

/// HTML as readable text: headings, paragraphs, lists, tables and links (as numbered
/// references) kept; scripts, styles and navigation chrome dropped.
pub fn to_text(html: &[u8]) -> Result<String, String> {
    const CHROME: &str = "script, style, noscript, template, nav, header, footer, aside, form, svg, iframe, \
                          button, select { display: none; }";
    let limited = limit_nesting(&String::from_utf8_lossy(html));
    html2text::config::plain()
        .add_css(CHROME)
        .map_err(|e| e.to_string())?
        .no_table_borders()
        .string_from_read(limited.as_bytes(), 100)
        .map_err(|e| e.to_string())
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
        let out = limit_nesting(page);
        assert!(!out.contains("x =") && !out.contains("color: red"), "{out}");
        assert!(out.contains(r#"<a href="https://e.org/?a=1&amp;b=&quot;2&quot;">link</a>"#), "{out}");
        assert!(out.contains("&lt;tag&gt;") && out.contains("<title>A &amp; B</title>"), "{out}");
        let text = to_text(page.as_bytes()).unwrap();
        assert!(text.contains("Title") && text.contains("link") && text.contains("<tag>"), "{text}");
        assert!(text.contains("https://e.org/?a=1&b=\"2\""), "{text}");
    }

    #[test]
    fn deep_nesting_is_unwrapped_and_its_text_kept() {
        let page = format!("{}deep text{}", "<div>".repeat(100_000), "</div>".repeat(100_000));
        let out = limit_nesting(&page);
        assert_eq!(out.matches("<div>").count(), MAX_DEPTH);
        assert_eq!(out.matches("</div>").count(), MAX_DEPTH);
        assert!(out.contains("deep text"));
        let unclosed = format!("{}x", "<b>".repeat(100_000));
        assert_eq!(limit_nesting(&unclosed).matches("<b>").count(), MAX_DEPTH);
        let paragraphs = "<p>x".repeat(1000);
        assert_eq!(limit_nesting(&paragraphs).matches("<p>").count(), 1000, "optional end tags are not depth");
    }
}
