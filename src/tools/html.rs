//! A fetched HTML page bounded before it is parsed, in time linear in its size whatever it holds.
//!
//! The conversion to Markdown (`page`: html5ever's tree builder under dom_query, dom_smoothie and
//! htmd) takes time quadratic in the nesting depth: the tree builder checks the stack of open
//! elements for each block start tag, and the converters recurse over the tree. A hostile page of 100,000 nested `<div>`s took
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

/// Elements with no content: never open.
const VOID: &[&str] = &[
    "area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr", "param",
    "keygen",
];

/// The most tags written: a page of nothing but tags is bounded too.
const MAX_TAGS: usize = 200_000;

/// What a start tag closes when one of these is the open element on top (as a new `<p>` closes
/// the open `<p>`, a new `<li>` the open `<li>`).
fn closes(name: &str) -> &'static [&'static str] {
    match name {
        "p" => &["p"],
        "li" => &["li"],
        "dt" | "dd" => &["dt", "dd"],
        "td" | "th" => &["td", "th"],
        "tr" => &["tr", "td", "th"],
        "thead" | "tbody" | "tfoot" => &["thead", "tbody", "tfoot", "tr", "td", "th"],
        "option" => &["option"],
        "optgroup" => &["optgroup", "option"],
        "rb" | "rt" | "rp" | "rtc" => &["rb", "rt", "rp", "rtc"],
        _ => &[],
    }
}

/// What is never shown, content and all (the tokenizer reads their content as raw text).
const DROPPED: &[&str] = &["script", "style", "template", "noscript", "iframe", "noembed", "noframes", "xmp"];

#[derive(Default)]
struct State {
    out: String,
    /// Characters of text seen, and how many may be written before the rest is only counted.
    text: usize,
    budget: usize,
    /// The elements open in what was written, innermost last: never more than `MAX_DEPTH`. The
    /// written page is balanced by it (an end tag closes what it names and what is open inside
    /// it; a stray one is dropped), so the parser's nesting is bounded by it too.
    open: Vec<String>,
    tags: usize,
    /// Inside a dropped element: its name.
    skipping: Option<String>,
}

struct Limiter(RefCell<State>);

/// `s` as HTML text (`&`, `<`, `>` escaped), appended to `out`.
pub(super) fn escape_text(out: &mut String, s: &str) {
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            c => out.push(c),
        }
    }
}

impl State {
    fn writing(&self) -> bool {
        self.text < self.budget && self.tags < MAX_TAGS
    }

    fn end_tag(&mut self, name: &str) {
        if self.writing() {
            self.tags += 1;
            self.out.push_str("</");
            self.out.push_str(name);
            self.out.push('>');
        }
    }

    fn start_tag(&mut self, tag: &html5ever::tokenizer::Tag) {
        if !self.writing() {
            return;
        }
        self.tags += 1;
        let out = &mut self.out;
        out.push('<');
        out.push_str(&tag.name);
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
        out.push('>');
    }

    /// Close the open elements down to the innermost `name` (true), or nothing if none is open.
    fn close(&mut self, name: &str) -> bool {
        let Some(at) = self.open.iter().rposition(|o| o == name) else { return false };
        while self.open.len() > at {
            if let Some(o) = self.open.pop() {
                self.end_tag(&o);
            }
        }
        true
    }

    fn tag(&mut self, tag: &html5ever::tokenizer::Tag) {
        let name: &str = &tag.name;
        if tag.kind == TagKind::EndTag {
            // A stray end tag (nothing of that name open, or dropped for depth) is dropped.
            self.close(name);
            return;
        }
        while self.open.last().is_some_and(|o| closes(name).contains(&o.as_str())) {
            if let Some(o) = self.open.pop() {
                self.end_tag(&o);
            }
        }
        if VOID.contains(&name) {
            self.start_tag(tag);
        } else if self.open.len() < MAX_DEPTH {
            self.start_tag(tag);
            if tag.self_closing {
                // `<div/>` opens a div in HTML: written closed, it opens nothing.
                self.end_tag(name);
            } else {
                self.open.push(name.to_string());
            }
        }
        // Deeper: unwrapped, its text kept.
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
                // (`<script/>` opens a script in HTML: its content is skipped all the same.)
                if tag.kind == TagKind::StartTag && DROPPED.contains(&name) {
                    st.skipping = Some(name.to_string());
                    return TokenSinkResult::RawData(if name == "script" {
                        RawKind::ScriptData
                    } else {
                        RawKind::Rawtext
                    });
                }
                st.tag(&tag);
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
        let text = super::super::page::to_markdown(page.as_bytes(), "https://e.org/", usize::MAX).unwrap().text;
        // `<tag>` as Markdown writes it; the link's quotes as a URL writes them.
        assert!(text.contains("## Title") && text.contains("\\<tag>"), "{text}");
        assert!(text.contains("[link](https://e.org/?a=1&b=%222%22)"), "{text}");
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

    /// The deepest nesting of a written page (it is balanced by construction).
    fn depth(out: &str) -> usize {
        let (mut d, mut max) = (0usize, 0usize);
        for piece in out.split('<').skip(1) {
            let name: String =
                piece.trim_start_matches('/').chars().take_while(|c| c.is_ascii_alphanumeric()).collect();
            if piece.starts_with('/') {
                d = d.saturating_sub(1);
            } else if !name.is_empty() && !VOID.contains(&name.as_str()) && !piece.starts_with('!') {
                d += 1;
                max = max.max(d);
            }
        }
        max
    }

    #[test]
    fn stray_end_tags_optional_ends_and_self_closing_tags_do_not_get_past_the_depth() {
        for (what, page) in [
            ("stray end tags", "<div></x>".repeat(100_000)),
            ("ruby outside ruby", "<rt>".repeat(100_000)),
            ("li and dd", "<li><dd>".repeat(50_000)),
            ("optgroup", "<optgroup>".repeat(100_000)),
            ("self-closing divs", "<div/>".repeat(100_000)),
            ("p and b", "<p><b>".repeat(50_000)),
        ] {
            let (out, _) = limit_nesting(&format!("{page}end"), usize::MAX);
            assert!(depth(&out) <= MAX_DEPTH, "{what}: {}", depth(&out));
            assert!(out.contains("end"), "{what}");
        }
        let (out, _) = limit_nesting("<p>a<script/>alert(1)</script>b</p>", usize::MAX);
        assert!(!out.contains("alert") && out.contains('a') && out.contains('b'), "{out}");
        let (out, _) = limit_nesting(&"<b>".repeat(300_000), usize::MAX);
        assert!(out.matches('<').count() <= MAX_TAGS);
    }

    #[test]
    fn only_the_text_budget_is_written_and_the_rest_is_counted() {
        let page = "<p>0123456789</p>".repeat(100);
        let (out, total) = limit_nesting(&page, 25);
        assert_eq!(total, 1000);
        assert_eq!(out.matches("0123456789").count(), 3, "{out}");
        let t = super::super::page::to_markdown(page.as_bytes(), "https://e.org/", 25).unwrap();
        assert!(t.cut && t.total_chars == 1000 && t.text.matches("0123456789").count() == 3, "{}", t.text);
    }
}
